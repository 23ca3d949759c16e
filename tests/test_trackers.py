"""logging.report_to: a real run reports to TensorBoard, W&B (offline) and Trackio (a local store
in a temporary folder), and each is read back with the tracker's own reader: the same numbers as
metrics.jsonl at the same steps under TRL's names (train/reward; eval/* as they are), the config,
and the sample completions. A tracker that is not
installed stops the run with the line that installs it. Each read-back test skips, saying which
extra it needs, where that extra is not installed (CI installs all three: .ci/run)."""

import importlib.util
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from checks import one_line_error
from mlx_grpo import cli
from mlx_grpo.config import load_config
from mlx_grpo.config.load import ConfigError
from mlx_grpo.run.log import read_jsonl, read_metrics
from mlx_grpo.run.trackers import EXTRAS, TRACKERS, Trackers, tracker_name

ROOT = Path(__file__).resolve().parent.parent
INSTALLED = [name for name in TRACKERS if importlib.util.find_spec(EXTRAS[name])]
FAST = ["training.max_steps=3", "training.prompts_per_step=2", "generation.num_generations=4",
        "generation.max_new_tokens=16", "checkpoint.save_every=10", "logging.log_completions=2"]


def needs(name: str):
    skip = pytest.mark.skipif(name not in INSTALLED, reason=f"the {name} extra is not installed "
                              f"(`uv sync --extra {name}`)")
    return lambda test: pytest.mark.extra(skip(test))


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """One 3-step run of the smoke profile, evaluated at step 2, reporting to every installed
    tracker, offline, as a user starts it; (run folder, trackio's folder)."""
    if not INSTALLED:
        pytest.skip("no tracker extra is installed (`uv sync --extra tensorboard` and so on)")
    tmp = tmp_path_factory.mktemp("trackers")
    out, trackio_dir = tmp / "run", tmp / "trackio"
    sets = [*FAST, "eval.every=2", "eval.limit=4", f'output_dir="{out}"', f"logging.report_to={json.dumps(INSTALLED)}",
            'logging.run_name="r1"']
    env = {**os.environ, "WANDB_MODE": "offline", "TRACKIO_DIR": str(trackio_dir), "WANDB_SILENT": "true"}
    proc = subprocess.run([sys.executable, "-m", "mlx_grpo", "train", "--config", "configs/smoke_test.toml",
                           *[x for s in sets for x in ("--set", s)]], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in INSTALLED:
        assert proc.stdout.count(f"mlx-grpo: reporting to {name}") == 1, proc.stdout
    # one line of ours per tracker, none of their banners (trackio's at start and at exit)
    assert "* " not in proc.stdout and "wandb:" not in proc.stdout + proc.stderr, proc.stdout
    return out, trackio_dir


def _numbers(row: dict) -> dict:
    """A metrics.jsonl row's numbers under the names trackers show: as transformers' rewrite_logs
    names TRL's, train/<key>, and eval/<key> (which our eval metrics already are)."""
    return {(k if k.startswith("eval/") else f"train/{k}"): v for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def test_trackers_get_training_metrics_under_train_and_eval_metrics_under_eval():
    class Fake:
        def log(self, step, metrics):
            self.logged = (step, metrics)

    trackers = Trackers(load_config(None, []))  # report_to is empty: no tracker opens
    trackers.open = [fake := Fake()]
    trackers.log({"step": 4, "reward": 0.5, "loss": -0.25, "rewards/xml_format/mean": 0.125, "kl": 0.0,
                  "eval/accuracy": 0.75, "eval/rewards/xml_format/mean": 0.5, "zero_signal_skipped": 1.0,
                  "note": "text", "flag": True})
    assert fake.logged == (4, {"train/reward": 0.5, "train/loss": -0.25, "train/rewards/xml_format/mean": 0.125,
                               "train/kl": 0.0, "eval/accuracy": 0.75, "eval/rewards/xml_format/mean": 0.5,
                               "train/zero_signal_skipped": 1.0})


def test_report_to_takes_only_known_tracker_names():
    assert load_config(None, []).logging.report_to == []  # none by default
    with pytest.raises(ConfigError, match="logging.report_to must be an array of distinct names from 'tensorboard'"):
        load_config(None, ['logging.report_to=["tensorbord"]'])
    with pytest.raises(ConfigError, match="logging.report_to"):
        load_config(None, ['logging.report_to=["wandb", "wandb"]'])


@pytest.mark.parametrize("name", list(TRACKERS))
def test_a_tracker_that_is_not_installed_stops_the_run_with_the_line_that_installs_it(
        name, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, EXTRAS[name], None)  # the import fails, as without the extra
    sets = [*FAST, f'output_dir="{tmp_path / "run"}"', f'logging.report_to=["{name}"]']
    assert cli.main(["train", "--config", "configs/smoke_test.toml", *[x for s in sets for x in ("--set", s)]]) == 2
    line = one_line_error(capsys, f"logging.report_to names '{name}', which is not installed: "
                                  f"`uv sync --extra {name}` installs it")
    assert line.startswith("mlx-grpo: error: ")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # stopped before the run began


def test_several_missing_trackers_are_named_in_one_line(tmp_path, capsys, monkeypatch):
    for name in ("tensorboard", "trackio"):
        monkeypatch.setitem(sys.modules, EXTRAS[name], None)
    sets = [*FAST, f'output_dir="{tmp_path / "run"}"', 'logging.report_to=["tensorboard", "trackio"]']
    assert cli.main(["train", "--config", "configs/smoke_test.toml", *[x for s in sets for x in ("--set", s)]]) == 2
    one_line_error(capsys, "logging.report_to names 'tensorboard', 'trackio', which are not installed: "
                           "`uv sync --extra tensorboard --extra trackio` installs them")


@needs("tensorboard")
def test_tensorboard_event_files_hold_the_metrics_config_and_samples(reported):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    out, _ = reported
    board = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    board.Reload()
    rows = read_metrics(out)
    assert set(board.Tags()["scalars"]) == {k for r in rows for k in _numbers(r)}
    assert {"train/reward", "train/loss", "eval/reward", "eval/accuracy"} <= set(board.Tags()["scalars"])
    assert not any(tag.startswith("train/eval/") or "/" not in tag for tag in board.Tags()["scalars"])
    for row in rows:
        for key, value in _numbers(row).items():
            (event,) = [e for e in board.Scalars(key) if e.step == row["step"]]
            assert event.value == pytest.approx(value, rel=1e-6, abs=1e-12)  # stored as float32
    text = lambda tag: [(e.step, tensor_util.make_ndarray(e.tensor_proto)[0].decode()) for e in board.Tensors(tag)]
    ((step, config),) = text("config")
    config = json.loads(config.strip("`\n"))
    assert (step, config["training"]["max_steps"], config["logging"]["report_to"]) == (0, 3, INSTALLED)
    samples = text("completions")
    assert [s for s, _ in samples] == [1, 2, 3]
    for row in read_jsonl(out / "completions.jsonl"):  # 2 a step
        table = dict(samples)[row["step"]]
        assert f"| {row['step']} | {row['prompt']} | " in table and f"| {row['reward']} |" in table


def wandb_records(path: Path):
    """The records of an offline W&B run file, parsed with W&B's own protobuf definitions. The
    file is a LevelDB-style log: a 7-byte header, then 32 KiB blocks of chunks, each with a
    7-byte header (CRC, length, kind: 1 whole record, 2 first, 3 middle, 4 last part)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, part = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            yield record


@needs("wandb")
def test_wandb_offline_run_holds_the_metrics_config_and_samples(reported):
    out, _ = reported
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    records = list(wandb_records(next(run_dir.glob("run-*.wandb"))))
    history = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
            history.setdefault(items["_step"], {}).update(items)
    rows = read_metrics(out)
    assert sorted(history) == [r["step"] for r in rows]
    for row in rows:
        for key, value in _numbers(row).items():
            assert history[row["step"]][key] == pytest.approx(value, rel=1e-12), key
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {i.key: json.loads(i.value_json) for i in run.config.update if not i.key.startswith("_")}
    assert (run.display_name, config["training"]["max_steps"], config["seed"]) == ("r1", 3, 0)
    for step in (1, 2, 3):
        assert history[step]["completions/_type"] == "table-file"
        table = json.loads((run_dir / "files" / history[step]["completions/path"]).read_text())
        want = [r for r in read_jsonl(out / "completions.jsonl") if r["step"] == step]
        assert table["columns"] == ["step", "prompt", "completion", "reward"]
        assert table["data"] == [[r["step"], r["prompt"], r["completion"], r["reward"]] for r in want]


@needs("trackio")
def test_trackio_local_store_holds_the_metrics_config_and_samples(reported):
    out, trackio_dir = reported
    read = ("import json; from trackio.sqlite_storage import SQLiteStorage as S; "
            "print(json.dumps({'projects': S.get_projects(), 'logs': S.get_logs('mlx-grpo', 'r1'), "
            "'config': S.get_run_config('mlx-grpo', 'r1')}))")
    env = {**os.environ, "TRACKIO_DIR": str(trackio_dir)}  # trackio reads it once, at import
    store = json.loads(subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True,
                                      check=True).stdout)
    assert store["projects"] == ["mlx-grpo"]
    logged = {}
    for entry in store["logs"]:
        logged.setdefault(entry["step"], {}).update(entry)
    for row in read_metrics(out):
        for key, value in _numbers(row).items():
            if math.isfinite(value):
                assert logged[row["step"]][key] == pytest.approx(value, rel=1e-12), key
    assert store["config"]["training"]["max_steps"] == 3
    for step in (1, 2, 3):
        table = logged[step]["completions"]
        assert table["_type"] == "trackio.table"
        want = [r for r in read_jsonl(out / "completions.jsonl") if r["step"] == step]
        assert table["_value"] == [{"step": r["step"], "prompt": r["prompt"], "completion": r["completion"],
                                    "reward": r["reward"]} for r in want]


@needs("wandb")
def test_a_tracker_that_cannot_start_stops_the_run_with_one_line(tmp_path):
    # W&B online with no login: wandb.init raises; the run stops naming the tracker and the cause
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), WANDB_DIR=str(tmp_path))  # no ~/.netrc key either
    sets = [*FAST, f'output_dir="{tmp_path / "run"}"', 'logging.report_to=["wandb"]']
    proc = subprocess.run([sys.executable, "-m", "mlx_grpo", "train", "--config", "configs/smoke_test.toml",
                           *[x for s in sets for x in ("--set", s)]], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1].startswith(
        "mlx-grpo: error: logging.report_to: wandb could not start: UsageError: No API key configured"), proc.stderr


@needs("tensorboard")
def test_tensorboard_holds_each_step_once_after_a_resume_that_redoes_steps(tmp_path, monkeypatch, capsys):
    """Step 3 is logged, then its checkpoint cannot be written (a full disk); the resume from step 2
    redoes step 3. TensorBoard shows each step once, with the resumed run's numbers."""
    import errno

    # the accumulator TensorBoard's server reads with; it holds every value as a tensor
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    import mlx_grpo.commands.train as train_mod

    out = tmp_path / "run"
    sets = [*FAST, "training.max_steps=4", "checkpoint.save_every=1", f'output_dir="{out}"',
            'logging.report_to=["tensorboard"]']
    args = ["train", "--config", "configs/smoke_test.toml", *[x for s in sets for x in ("--set", s)]]
    real = train_mod.save_checkpoint

    def full_at_3(output_dir, step, **kwargs):
        if step == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(output_dir, step, **kwargs)

    monkeypatch.setattr(train_mod, "save_checkpoint", full_at_3)
    assert cli.main(args) == 2
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    monkeypatch.setattr(train_mod, "save_checkpoint", real)
    assert cli.main([*args, "--resume"]) == 0
    board = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    board.Reload()
    value = lambda e: tensor_util.make_ndarray(e.tensor_proto)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("reward", "loss", "completions/mean_length"):
        assert [(e.step, pytest.approx(float(value(e)), rel=1e-6)) for e in board.Tensors(tracker_name(key))] == [
            (r["step"], r[key]) for r in rows]
    assert [e.step for e in board.Tensors("completions")] == [1, 2, 3, 4]
    configs = [(e.step, json.loads(value(e)[0].decode().strip("`\n"))) for e in board.Tensors("config")]
    assert [(step, c["checkpoint"]["resume"]) for step, c in configs] == [(0, False), (3, True)]

    # --overwrite starts over: the earlier run's event files stay in the folder, and are not shown
    assert cli.main([*args, "--set", "training.max_steps=2", "--set", "seed=5", "--overwrite"]) == 0
    board = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    board.Reload()
    rows = read_metrics(out)
    assert [(e.step, pytest.approx(float(value(e)), rel=1e-6)) for e in board.Tensors("train/reward")] == [
        (r["step"], r["reward"]) for r in rows] and len(rows) == 2
    assert [e.step for e in board.Tensors("config")] == [0]
