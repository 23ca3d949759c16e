"""Exact resume after SIGKILL and after SIGINT/SIGTERM, and which runs an output_dir accepts."""

import json
import os
import random as pyrandom
import re
import signal
import subprocess
import sys
import time

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo import cli
from mlx_grpo.config import load_config, save_config
from mlx_grpo.errors import TrainingError
from mlx_grpo.run.log import read_metrics, truncate_jsonl
from mlx_grpo.run.resume import config_differences, open_run
from mlx_grpo.rng import capture_rng, restore_rng
from mlx_grpo.commands.train import train

SMOKE = "configs/smoke_test.toml"
RUN = ["training.prompts_per_step=2", "generation.max_new_tokens=16", "training.learning_rate=1e-3",
       "checkpoint.save_every=1", "checkpoint.keep_last=20", "logging.log_completions=0"]
TIMING = {"step_time", "tokens_per_second", "peak_memory_gb", "time/rewards"}


def _sets(out, steps, *extra):
    items = RUN + [f"training.max_steps={steps}", f'output_dir="{out}"', *extra]
    return [arg for item in items for arg in ("--set", item)]


def _metrics(out):
    return [{k: v for k, v in row.items() if k not in TIMING} for row in read_metrics(out)]


def _weights(ckpt, name):
    return mx.load(str(ckpt / name))


def _assert_bitwise(a: dict, b: dict):
    assert a.keys() == b.keys() and a
    different = [k for k in a if not mx.array_equal(a[k], b[k]).item()]
    assert not different


def test_rng_states_round_trip():
    mx.random.seed(7), np.random.seed(7), pyrandom.seed(7)
    mx.random.uniform(shape=(3,)), np.random.rand(), pyrandom.random()
    state = json.loads(json.dumps(capture_rng()))  # as stored in trainer_state.json
    first = (mx.random.uniform(shape=(4,)), np.random.rand(4), [pyrandom.random() for _ in range(4)])
    mx.random.seed(99), np.random.seed(99), pyrandom.seed(99)
    restore_rng(state)
    again = (mx.random.uniform(shape=(4,)), np.random.rand(4), [pyrandom.random() for _ in range(4)])
    assert mx.array_equal(first[0], again[0]).item()
    assert np.array_equal(first[1], again[1]) and first[2] == again[2]


def test_sigkill_after_a_checkpoint_then_resume_equals_uninterrupted_run(tmp_path):
    """Full fine-tune, 6 steps; the killed run is a real process, killed with SIGKILL. (With 4 steps
    and a kill up to 0.4 s after step 2's checkpoint, steps of 0.11 s finished the run first.)"""
    steps = 6
    ref = load_config(SMOKE, _sets(tmp_path / "ref", steps)[1::2])
    train(ref)

    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "mlx_grpo", "train", "--config", SMOKE, *_sets(out, steps)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = out / "checkpoints" / "step_000002"
    deadline = time.monotonic() + 120
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(pyrandom.Random(5).uniform(0.0, 0.1))  # some point after the checkpoint
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    killed_at = max(int(p.name[5:11]) for p in (out / "checkpoints").glob("step_??????"))
    assert 2 <= killed_at < steps

    assert cli.main(["train", "--config", SMOKE, *_sets(out, steps), "--resume"]) == 0
    final = f"checkpoints/step_{steps:06d}"
    _assert_bitwise(_weights(tmp_path / "ref" / final, "model.safetensors"),
                    _weights(out / final, "model.safetensors"))
    _assert_bitwise(_weights(tmp_path / "ref" / final, "optimizer.safetensors"),
                    _weights(out / final, "optimizer.safetensors"))
    assert [r["step"] for r in read_metrics(out)] == list(range(1, steps + 1))
    assert _metrics(out) == _metrics(tmp_path / "ref")


@pytest.fixture
def signal_at_step(monkeypatch):
    """Send `signum` to this process while step `at` is generating."""
    import mlx_grpo.rollout.score as train_mod

    real = train_mod.generate_completions

    def arm(signum, at):
        calls = []

        def generate(*args, **kwargs):
            calls.append(1)
            if len(calls) == at:
                os.kill(os.getpid(), signum)
            return real(*args, **kwargs)

        monkeypatch.setattr(train_mod, "generate_completions", generate)

    return arm


def test_sigint_finishes_the_step_checkpoints_and_resumes_exactly_with_lora(tmp_path, signal_at_step, capsys):
    steps, lora = 3, ["lora.enabled=true", "lora.rank=4", "training.learning_rate=1e-2",
                      "checkpoint.save_every=10"]
    ref = load_config(SMOKE, _sets(tmp_path / "ref", steps, *lora)[1::2])
    train(ref)

    out = tmp_path / "stopped"
    signal_at_step(signal.SIGINT, at=2)
    assert cli.main(["train", "--config", SMOKE, *_sets(out, steps, *lora)]) == 130
    err = capsys.readouterr().err
    assert f"stopped by SIGINT after step 2; checkpoint {out / 'checkpoints' / 'step_000002'}" in err
    assert "resume with: mlx-grpo train --config configs/smoke_test.toml --set" in err and err.rstrip().endswith("--resume")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers put back
    assert [r["step"] for r in read_metrics(out)] == [1, 2]

    signal_at_step(signal.SIGINT, at=0)  # no signal this time
    assert cli.main(["train", "--config", SMOKE, *_sets(out, steps, *lora), "--resume"]) == 0
    final = f"checkpoints/step_{steps:06d}"
    _assert_bitwise(_weights(tmp_path / "ref" / final, "adapters.safetensors"),
                    _weights(out / final, "adapters.safetensors"))
    assert _metrics(out) == _metrics(tmp_path / "ref")
    # Resuming a finished run does nothing and hands back its last checkpoint.
    done = load_config(SMOKE, _sets(out, steps, *lora)[1::2] + ["checkpoint.resume=true"])
    assert train(done) == out / final and _metrics(out) == _metrics(tmp_path / "ref")


@pytest.mark.parametrize("after", [1, 3])
def test_the_unmoved_tensor_check_of_a_resumed_run_is_the_uninterrupted_runs(tmp_path, signal_at_step, after):
    """Stopped after step 2: the check made at step 1 is not made again; the one due at step 3
    (3 updates after the run's start, against the weights as it started) is made at step 3."""
    steps, check = 4, [f"logging.warn_unmoved_after={after}"]
    train(load_config(SMOKE, _sets(tmp_path / "ref", steps, *check)[1::2]))
    assert [r["step"] for r in read_metrics(tmp_path / "ref") if "params/unmoved_tensors" in r] == [after]

    out = tmp_path / "stopped"
    signal_at_step(signal.SIGINT, at=2)
    assert cli.main(["train", "--config", SMOKE, *_sets(out, steps, *check)]) == 130
    assert [r["step"] for r in read_metrics(out)] == [1, 2]
    signal_at_step(signal.SIGINT, at=0)
    assert cli.main(["train", "--config", SMOKE, *_sets(out, steps, *check), "--resume"]) == 0
    assert _metrics(out) == _metrics(tmp_path / "ref")


def test_a_bfloat16_full_fine_tune_resumes_bitwise_with_its_master_weights(tmp_path, signal_at_step):
    """The bf16 weights, the float32 master copy and the moments all continue exactly."""
    steps, bf16 = 3, ["model.dtype=bfloat16", "checkpoint.save_every=10"]
    train(load_config(SMOKE, _sets(tmp_path / "ref", steps, *bf16)[1::2]))
    out = tmp_path / "stopped"
    signal_at_step(signal.SIGINT, at=2)
    assert cli.main(["train", "--config", SMOKE, *_sets(out, steps, *bf16)]) == 130
    signal_at_step(signal.SIGINT, at=0)
    assert cli.main(["train", "--config", SMOKE, *_sets(out, steps, *bf16), "--resume"]) == 0
    final = f"checkpoints/step_{steps:06d}"
    weights = _weights(out / final, "model.safetensors")
    state = _weights(out / final, "optimizer.safetensors")
    assert weights["model.norm.weight"].dtype == mx.bfloat16  # mlx-lm loads it as before
    masters = [k for k in state if k.endswith(".master")]
    assert len(masters) == len(weights) and all(state[k].dtype == mx.float32 for k in masters)
    _assert_bitwise(_weights(tmp_path / "ref" / final, "model.safetensors"), weights)
    _assert_bitwise(_weights(tmp_path / "ref" / final, "optimizer.safetensors"), state)
    assert _metrics(out) == _metrics(tmp_path / "ref")


def test_sigterm_stops_with_143_and_a_checkpoint(tmp_path, signal_at_step, capsys, monkeypatch):
    from mlx_grpo.run import stopping

    monkeypatch.setattr(stopping, "GRACE_S", 600.0)  # a step that ends within the grace is finished
    out = tmp_path / "run"
    signal_at_step(signal.SIGTERM, at=1)
    assert cli.main(["train", "--config", SMOKE, *_sets(out, 3, "checkpoint.save_every=10", "grpo.beta=0")]) == 143
    assert "stopped by SIGTERM after step 1" in capsys.readouterr().err
    state = json.loads((out / "checkpoints" / "step_000001" / "trainer_state.json").read_text())
    assert state["step"] == 1 and state["data_position"] == 2 and len(state["rng"]["mlx"]) == 2


CTRL_C_WHEN_IMPORTING = """\
import importlib.abc, os, runpy, signal, sys

MODULE = sys.argv[1]

class CtrlC(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == MODULE:  # Ctrl-C as that module starts loading
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["mlx-grpo", *sys.argv[2:]]
runpy.run_module("mlx_grpo", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module", ["numpy", "mlx.core", "mlx_lm", "transformers"])
def test_ctrl_c_while_the_command_loads_is_one_line_and_exit_130(tmp_path, module):
    """The first second or so of `mlx-grpo train` imports MLX and mlx-lm: a Ctrl-C there was a traceback."""
    proc = subprocess.run([sys.executable, "-c", CTRL_C_WHEN_IMPORTING, module, "train", "--config",
                           str(tmp_path / "none.toml")], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (130, "mlx-grpo: interrupted\n")


def test_second_ctrl_c_ends_the_process_at_once(tmp_path):
    script = (
        "import sys, time\n"
        "from mlx_grpo.run.stopping import StopRequest\n"
        "with StopRequest() as stop:\n"
        "    print('ready', flush=True)\n"
        "    while True: time.sleep(0.01)\n"  # a step that never ends
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    assert proc.poll() is None  # the first one only asks to stop after the step
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=5)
    assert proc.returncode == -signal.SIGINT
    assert b"Ctrl-C again to quit at once" in proc.stderr.read()


def _fake_run(out, cfg, step=3):
    """An output_dir as a run leaves it: config.toml, metrics.jsonl and one checkpoint."""
    save_config(cfg, out / "config.toml")
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": s}) + "\n" for s in range(1, 6)))
    ckpt = out / "checkpoints" / f"step_{step:06d}"
    save_config(cfg, ckpt / "config.toml")
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": step, "data_position": 6, "rng": {}}))
    (out / "notes.txt").write_text("mine")


def test_an_output_dir_with_a_run_is_refused_without_resume_or_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    _fake_run(out, load_config(SMOKE, [f'output_dir="{out}"']))
    before = sorted(p.name for p in out.rglob("*"))
    assert cli.main(["--config", SMOKE, "--set", f'output_dir="{out}"']) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds a run" in err and "step_000003" in err
    assert "--resume" in err and "--overwrite" in err
    assert sorted(p.name for p in out.rglob("*") if p.name != ".lock") == before  # .lock: the lock, taken first


def test_resume_with_a_changed_config_names_the_keys_unless_forced(tmp_path, capsys):
    out = tmp_path / "run"
    _fake_run(out, load_config(SMOKE, [f'output_dir="{out}"']))
    changed = ["--set", f'output_dir="{out}"', "--set", "grpo.beta=0.1", "--set", "data.shuffle=false",
               "--set", "training.max_steps=99", "--set", "logging.log_every=5"]
    assert cli.main(["--config", SMOKE, *changed, "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "2 key(s): data.shuffle (run: True, now: False); grpo.beta (run: 0.0, now: 0.1); pass --force" in err

    cfg = load_config(SMOKE, changed[1::2] + ["checkpoint.resume=true"])
    point = open_run(cfg, force=True)
    assert (point.step, point.data_position, point.bad_steps) == (3, 6, 0)


def test_overwrite_removes_only_the_run_files(tmp_path):
    out = tmp_path / "run"
    cfg = load_config(SMOKE, [f'output_dir="{out}"'])
    _fake_run(out, cfg)
    assert open_run(cfg, overwrite=True) is None
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_docs_name_exactly_what_overwrite_deletes():
    """docs/runs-and-faults.md's --overwrite paragraph lists RUN_FILES, no more and no fewer (it named three
    files while four are deleted: completions.jsonl was missing)."""
    from pathlib import Path

    from mlx_grpo.run.layout import RUN_FILES

    readme = Path(__file__).parent.parent.joinpath("docs", "runs-and-faults.md").read_text()
    paragraph = readme[readme.index("- An `output_dir` holding a run"):].split("\n- ", 1)[0]
    held = re.search(r"holding a run \((.*?)\)", paragraph, re.S)[1]  # what makes a folder a run
    named = re.findall(r"`([\w.]+)/?`", held)
    assert named == list(RUN_FILES)
    assert f"deletes only\n  those {['', '', '', 'three', 'four'][len(RUN_FILES)]}" in paragraph


def test_resume_without_a_checkpoint_starts_fresh(tmp_path, capsys):
    cfg = load_config(SMOKE, [f'output_dir="{tmp_path / "new"}"', "checkpoint.resume=true"])
    assert open_run(cfg) is None
    assert "no complete checkpoint" in capsys.readouterr().out


def test_config_differences_ignore_max_steps_logging_and_resume():
    a = {"seed": 0, "training": {"max_steps": 10, "learning_rate": 1e-3}, "logging": {"log_every": 1},
         "checkpoint": {"resume": False}, "rewards": [{"name": "x", "weight": 1.0}]}
    b = {"seed": 0, "training": {"max_steps": 50, "learning_rate": 1e-3}, "logging": {"log_every": 9},
         "checkpoint": {"resume": True}, "rewards": [{"name": "x", "weight": 2.0}]}
    assert config_differences(a, b) == [
        "rewards (run: [{'name': 'x', 'weight': 1.0}], now: [{'name': 'x', 'weight': 2.0}])"
    ]
    assert config_differences(a, {**a, "new_key": 1}) == ["new_key (run: 'unset', now: 1)"]


def test_truncate_jsonl_drops_later_rows_and_a_cut_line(tmp_path):
    rows = [json.dumps({"step": s, "loss": 0.5}) for s in (1, 2, 3, 4)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + '\n{"step": 5, "lo')
    truncate_jsonl(tmp_path / "metrics.jsonl", 2)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_a_sweep_refuses_an_earlier_sweeps_run_unless_overwrite(tmp_path, monkeypatch):
    import mlx_grpo.commands.train as train_mod
    from mlx_grpo.commands.sweep import run_sweep

    variant = tmp_path / "sweep" / "grpo.beta=0"
    _fake_run(variant, load_config(SMOKE, [f'output_dir="{variant}"']))
    sets = [f'output_dir="{tmp_path}"']
    with pytest.raises(TrainingError, match="already holds a run"):
        run_sweep(SMOKE, ["grpo.beta=0"], overrides=sets)

    seen = []

    def fake_train(cfg, config_path=None, *, overwrite=False, force=False, progress=True):
        seen.append((overwrite, progress))
        open_run(cfg, overwrite=overwrite)
        (variant / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")

    monkeypatch.setattr(train_mod, "train", fake_train)
    rows = run_sweep(SMOKE, ["grpo.beta=0"], overrides=sets, overwrite=True, progress=False)  # --no-progress
    assert seen == [(True, False)] and rows[0]["final_reward"] == 0.5
    assert sorted(p.name for p in variant.iterdir() if p.name != ".lock") == ["metrics.jsonl", "notes.txt"]
