"""A run folder no one can corrupt: its lock, damaged checkpoints and logs, failed starts, and
one line for every bad file (issue 19). Each case is a unit call or a 1-2 step run."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from checks import one_line_error as _one_line_error
from mlx_grpo import cli
from mlx_grpo.config import load_config
from mlx_grpo.run.lock import RunFolderBusy, lock_run_folder

SMOKE = "configs/smoke_test.toml"
RUN = ["training.prompts_per_step=2", "generation.max_new_tokens=8", "training.learning_rate=1e-3",
       "checkpoint.save_every=1", "checkpoint.keep_last=5", "logging.log_completions=0"]


def _sets(out, steps, *extra):
    items = RUN + [f"training.max_steps={steps}", f'output_dir="{out}"', *extra]
    return [arg for item in items for arg in ("--set", item)]


# --- the lock ---------------------------------------------------------------------------------

def test_a_second_process_on_a_locked_run_folder_is_refused_naming_pid_and_host(tmp_path, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom mlx_grpo.run.lock import lock_run_folder\n"
         f"with lock_run_folder({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        tic = time.monotonic()
        for extra in ([], ["--resume"]):
            assert cli.main(["--config", SMOKE, *_sets(out, 1), *extra]) == 2
            _one_line_error(capsys, "in use by", f"PID {holder.pid}", socket.gethostname())
        assert time.monotonic() - tic < 10  # refused at once, before loading anything
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with lock_run_folder(out):  # a SIGKILL leaves no stale lock behind
        with pytest.raises(RunFolderBusy, match=f"PID {os.getpid()} on"):
            with lock_run_folder(out):  # a second open file in the same process is refused too
                pass
        # ... and that refusal did not release the lock (closing any copy of a lockf'd file would)
        other = subprocess.run([sys.executable, "-c", f"from mlx_grpo.run.lock import lock_run_folder\n"
                                f"with lock_run_folder({str(out)!r}):\n    pass"], capture_output=True, text=True)
        assert "RunFolderBusy" in other.stderr and f"PID {os.getpid()} on" in other.stderr, other.stderr


@pytest.mark.parametrize("inside", [False, True])
def test_an_output_dir_that_is_a_file_is_one_line_naming_output_dir(tmp_path, capsys, inside):
    """It was `[Errno 17] File exists` (or 20, Not a directory)."""
    (tmp_path / "notes").write_text("mine")
    out = tmp_path / "notes" / "run" if inside else tmp_path / "notes"
    assert cli.main(["--config", SMOKE, *_sets(out, 1)]) == 2
    _one_line_error(capsys, f"output_dir: {out} cannot be a folder: {tmp_path / 'notes'} is a file; "
                            "choose another output_dir")
    assert (tmp_path / "notes").read_text() == "mine"


FORKS_A_WORKER = """\
import os, time

def r(prompts, completions, answers, **kw):
    # In step 2: fork a worker that outlives the run, then wait here to be SIGKILLed.
    if os.path.exists({checkpoint!r}) and not os.path.exists({pid_file!r}):
        pid = os.fork()
        if pid == 0:
            time.sleep(300)
            os._exit(0)
        with open({pid_file!r} + ".tmp", "w") as f:
            f.write(str(pid))
        os.rename({pid_file!r} + ".tmp", {pid_file!r})
        time.sleep(300)
    return [0.0] * len(completions)
"""


def test_a_child_the_run_forked_does_not_hold_the_lock_after_a_sigkill(tmp_path, capsys):
    out, pid_file = tmp_path / "run", tmp_path / "worker.pid"
    checkpoint = out / "checkpoints" / "step_000001" / "checkpoint_manifest.json"
    (tmp_path / "forks.py").write_text(FORKS_A_WORKER.format(checkpoint=str(checkpoint), pid_file=str(pid_file)))
    args = ["--config", SMOKE, *_sets(out, 2), "--set", f'rewards=[{{name="{tmp_path / "forks.py"}:r", weight=1.0}}]']
    worker = None
    # A preloaded multi-threaded OpenBLAS joins its threads before a fork, which hung 1 fork in 3
    # here; with one thread it has none to join.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    with open(tmp_path / "log", "w") as log:  # not a pipe: the worker keeps a copy of it open
        run = subprocess.Popen([sys.executable, "-m", "mlx_grpo", *args], stdout=log, stderr=log, env=env)
    try:
        while not pid_file.exists() and run.poll() is None:
            time.sleep(0.05)
        assert pid_file.exists(), (tmp_path / "log").read_text()[-3000:]
        worker = int(pid_file.read_text())
        run.send_signal(signal.SIGKILL)
        run.wait()
        os.kill(worker, 0)  # the worker is alive, holding the run's open files
        capsys.readouterr()
        assert cli.main([*args, "--resume"]) == 0, capsys.readouterr().err
        assert "resumed from" in capsys.readouterr().out
        os.kill(worker, 0)  # still alive: the resume did not wait for it
    finally:
        run.kill()
        if worker is not None:
            os.kill(worker, signal.SIGKILL)


# --- metrics.jsonl on resume ------------------------------------------------------------------

def test_resume_keeps_every_readable_row_and_moves_damaged_lines_aside(tmp_path):
    from mlx_grpo.run.log import read_metrics, truncate_jsonl

    rows = [json.dumps({"step": s, "loss": 0.5}) for s in range(1, 13)]
    rows[4] = '{"step": 5, "lo\xff'  # row 5 of 12 damaged (and not even UTF-8 after encoding)
    rows[7] = "[8]"  # valid JSON, but not a row
    (tmp_path / "metrics.jsonl").write_bytes("\n".join(rows).encode("latin-1") + b'\n{"step": 13, "lo')
    assert truncate_jsonl(tmp_path / "metrics.jsonl", 10) == [5, 8, 13]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 6, 7, 9, 10]
    aside = (tmp_path / "metrics.jsonl.damaged").read_bytes().splitlines()
    assert aside == [rows[4].encode("latin-1"), b"[8]", b'{"step": 13, "lo']


def test_a_resumed_run_reports_the_damaged_metrics_line(tmp_path, capsys):
    from mlx_grpo.run.log import read_metrics

    out = tmp_path / "run"
    assert cli.main(["--config", SMOKE, *_sets(out, 2)]) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("garbage\n" + lines[1] + "\n")
    capsys.readouterr()
    assert cli.main(["--config", SMOKE, *_sets(out, 3), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "metrics.jsonl: 1 unreadable line(s) (1) moved to metrics.jsonl.damaged" in err
    assert [r["step"] for r in read_metrics(out)] == [2, 3]
    assert (out / "metrics.jsonl.damaged").read_text() == "garbage\n"


# --- a start that failed ----------------------------------------------------------------------

def test_config_toml_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    import errno
    from pathlib import Path

    from mlx_grpo.config import save_config

    def full(self, text, **kwargs):
        open(self, "w").close()  # the file is created, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError):
        save_config(load_config(SMOKE), tmp_path / "config.toml")
    assert not (tmp_path / "config.toml").exists()


@pytest.mark.parametrize("resume", [False, True])
def test_a_folder_left_by_a_failed_start_is_not_yet_a_run(tmp_path, capsys, resume):
    from mlx_grpo.run.log import read_metrics

    out = tmp_path / "run"
    (out / "checkpoints" / "step_000001.tmp").mkdir(parents=True)
    (out / "config.toml").write_text("")  # as a full disk left it before this fix
    (out / "metrics.jsonl").write_text("")
    (out / "notes.txt").write_text("mine")
    assert cli.main(["--config", SMOKE, *_sets(out, 1), *(["--resume"] if resume else [])]) == 0
    assert [r["step"] for r in read_metrics(out)] == [1]
    assert load_config(out / "config.toml").training.max_steps == 1
    assert (out / "notes.txt").read_text() == "mine"


# --- damaged checkpoints ----------------------------------------------------------------------

TIMING = {"step_time", "tokens_per_second", "peak_memory_gb", "time/rewards"}


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
    """An uninterrupted 3-step full fine-tune with a checkpoint per step."""
    out = tmp_path_factory.mktemp("ref") / "run"
    assert cli.main(["--config", SMOKE, *_sets(out, 3)]) == 0
    return out


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE = {  # file in the newest checkpoint: what is done to it
    "model.safetensors": _truncate,
    "optimizer.safetensors": lambda p: p.write_bytes(b""),
    "trainer_state.json": lambda p: p.write_text("{garbage"),
    "config.toml": lambda p: p.write_bytes(b"\x00\x01 not toml"),
}


@pytest.mark.parametrize("name", DAMAGE)
def test_resume_skips_a_damaged_newest_checkpoint_and_resumes_exactly(tmp_path, three_steps, capsys, name):
    import shutil

    import mlx.core as mx

    from mlx_grpo.run.log import read_metrics

    out = tmp_path / "run"
    shutil.copytree(three_steps, out)
    shutil.rmtree(out / "checkpoints" / "step_000003")  # as if killed during step 3
    DAMAGE[name](out / "checkpoints" / "step_000002" / name)
    capsys.readouterr()
    assert cli.main(["--config", SMOKE, *_sets(out, 3), "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"damaged checkpoint(s) skipped: step_000002: {name}" in err and "resuming from step_000001" in err
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING} for r in rows]
    assert strip(read_metrics(out)) == strip(read_metrics(three_steps))
    a = mx.load(str(out / "checkpoints" / "step_000003" / "model.safetensors"))
    b = mx.load(str(three_steps / "checkpoints" / "step_000003" / "model.safetensors"))
    assert a.keys() == b.keys() and all(mx.array_equal(a[k], b[k]).item() for k in a)


def test_resume_with_no_intact_checkpoint_is_one_line(tmp_path, three_steps, capsys):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(three_steps, out)
    for ckpt in (out / "checkpoints").iterdir():
        (ckpt / "model.safetensors").write_bytes(b"")
    assert cli.main(["--config", SMOKE, *_sets(out, 4), "--resume"]) == 2
    _one_line_error(capsys, "no intact checkpoint", "step_000003: model.safetensors has 0 bytes", "--overwrite")


def _resumes_exactly_from_step_2(out, three_steps):
    import mlx.core as mx

    from mlx_grpo.run.log import read_metrics

    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING} for r in rows]
    assert strip(read_metrics(out)) == strip(read_metrics(three_steps))
    a = mx.load(str(out / "checkpoints" / "step_000003" / "model.safetensors"))
    b = mx.load(str(three_steps / "checkpoints" / "step_000003" / "model.safetensors"))
    assert a.keys() == b.keys() and all(mx.array_equal(a[k], b[k]).item() for k in a)


MANIFEST_DAMAGE = {  # what is done to the newest checkpoint's manifest
    "missing": lambda p: p.unlink(),
    "empty": lambda p: p.write_text(""),
    "null": lambda p: p.write_text("null"),
    "no files": lambda p: p.write_text("{}"),
}


@pytest.mark.parametrize("damage", MANIFEST_DAMAGE)
def test_a_newest_checkpoint_without_a_usable_manifest_and_truncated_weights_is_skipped(tmp_path, three_steps,
                                                                                      capsys, damage):
    """Never the advice to pass --overwrite, which would delete the two intact checkpoints."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(three_steps, out)
    ckpt = out / "checkpoints" / "step_000003"
    MANIFEST_DAMAGE[damage](ckpt / "checkpoint_manifest.json")
    _truncate(ckpt / "model.safetensors")
    capsys.readouterr()
    assert cli.main(["--config", SMOKE, *_sets(out, 3), "--resume"]) == 0
    printed = capsys.readouterr()
    assert "damaged checkpoint(s) skipped: step_000003: checkpoint_manifest.json " in printed.err
    assert "resuming from step_000002" in printed.err
    assert "--overwrite" not in printed.out + printed.err
    _resumes_exactly_from_step_2(out, three_steps)


def test_a_checkpoint_from_before_manifests_with_truncated_weights_is_skipped(tmp_path, three_steps, capsys):
    """A run written before manifests: its checkpoints are trusted when their weights files are whole."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(three_steps, out)
    for ckpt in (out / "checkpoints").iterdir():
        (ckpt / "checkpoint_manifest.json").unlink()
    weights = out / "checkpoints" / "step_000003" / "model.safetensors"
    size = weights.stat().st_size
    _truncate(weights)
    capsys.readouterr()
    assert cli.main(["--config", SMOKE, *_sets(out, 3), "--resume"]) == 0
    err = capsys.readouterr().err
    assert (f"step_000003: checkpoint_manifest.json is missing and model.safetensors has {size // 2} bytes, "
            f"its header needs {size}; resuming from step_000002") in err
    _resumes_exactly_from_step_2(out, three_steps)


def test_an_old_checkpoint_that_does_not_load_names_the_one_before_it_not_overwrite(tmp_path, three_steps, capsys):
    """Whole weights files that do not fit the model (a tensor left out): found only by loading."""
    import shutil

    import mlx.core as mx

    out = tmp_path / "run"
    shutil.copytree(three_steps, out)
    for ckpt in (out / "checkpoints").iterdir():
        (ckpt / "checkpoint_manifest.json").unlink()
    weights = out / "checkpoints" / "step_000003" / "model.safetensors"
    tensors = mx.load(str(weights))
    mx.save_safetensors(str(weights), dict(list(tensors.items())[1:]))
    assert cli.main(["--config", SMOKE, *_sets(out, 4), "--resume"]) == 2
    line = _one_line_error(capsys, "cannot load", "step_000003",
                           f"move it out of {out / 'checkpoints'} to resume from step_000002")
    assert "--overwrite" not in line


def test_resume_with_max_steps_below_the_checkpoint_is_one_line(tmp_path, three_steps, capsys):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(three_steps, out)
    assert cli.main(["--config", SMOKE, *_sets(out, 2), "--resume"]) == 2
    _one_line_error(capsys, "training.max_steps: 2 is below step 3")


COMMANDS = {  # a command on a model M
    "generate": lambda m, tmp: ["generate", "--model", m, "--prompt", "1+1?", "--max-tokens", "2"],
    "eval": lambda m, tmp: ["eval", "--model", m, "--limit", "1", "--max-tokens", "2"],
    "export": lambda m, tmp: ["export", m, "--out", str(tmp / "exported")],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_commands_on_a_damaged_checkpoint_give_one_line_naming_the_file(tmp_path, three_steps, capsys, command,
                                                                        name):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(three_steps, out)
    _truncate(out / "checkpoints" / "step_000003" / name)
    assert cli.main(COMMANDS[command](str(out / "checkpoints" / "step_000003"), tmp_path)) == 2
    _one_line_error(capsys, "step_000003 is damaged", name)
    assert not (tmp_path / "exported").exists()


def test_commands_on_a_run_skip_its_damaged_newest_checkpoint_naming_it(tmp_path, three_steps, capsys):
    import shutil

    from mlx_grpo.models.named import load_model

    out = tmp_path / "run"
    shutil.copytree(three_steps, out)
    _truncate(out / "checkpoints" / "step_000003" / "model.safetensors")
    assert load_model(str(out)).checkpoint == out / "checkpoints" / "step_000002"
    assert "damaged checkpoint(s) skipped: step_000003: model.safetensors has" in capsys.readouterr().err
    assert cli.main(COMMANDS["generate"](str(out), tmp_path)) == 0
    assert "; using step_000002" in capsys.readouterr().err


def _train_and_prune(out):
    """What a run training in `out` does: write step 4, then prune to keep_last = 1."""
    import shutil

    ckpts = out / "checkpoints"
    shutil.copytree(ckpts / "step_000003", ckpts / "step_000004.tmp")
    (ckpts / "step_000004.tmp").rename(ckpts / "step_000004")
    for step in (1, 2, 3):
        shutil.rmtree(ckpts / f"step_00000{step}")


@pytest.mark.parametrize("when", ["checking", "loading"])
def test_generate_on_a_run_that_prunes_the_checkpoint_being_read_reads_the_newest(tmp_path, three_steps, capsys,
                                                                                monkeypatch, when):
    """Before: an error saying the pruned checkpoint was damaged, or could not be loaded."""
    import shutil

    import mlx_lm

    import mlx_grpo.run.checkpoint as checkpoint

    out = tmp_path / "run"
    shutil.copytree(three_steps, out)
    module, name = (checkpoint, "_sha256") if when == "checking" else (mlx_lm, "load")
    real, calls = getattr(module, name), []

    def racing(*args, **kwargs):
        if not calls:
            _train_and_prune(out)
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, racing)
    capsys.readouterr()
    assert cli.main(COMMANDS["generate"](str(out), tmp_path)) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "mlx-grpo: error" not in err and "damaged" not in err, err
    from mlx_grpo.models.named import load_model

    assert load_model(str(out)).checkpoint == out / "checkpoints" / "step_000004"


@pytest.mark.parametrize("command", COMMANDS)
def test_commands_on_a_model_folder_with_truncated_weights_give_one_line(tmp_path, tiny_path, capsys, command):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_path, folder)
    _truncate(folder / "model.safetensors")
    assert cli.main(COMMANDS[command](str(folder), tmp_path)) == 2
    _one_line_error(capsys, f"cannot load {folder}")


# --- rewards and config -----------------------------------------------------------------------

@pytest.mark.parametrize("where", ["import", "scoring"])
def test_sys_exit_in_a_reward_is_one_line_naming_the_reward(tmp_path, capsys, where):
    body = ("import sys\nsys.exit(0)\ndef r(prompts, completions, answers, **kw):\n    return [0.0] * len(completions)\n"
            if where == "import" else
            "import sys\ndef r(prompts, completions, answers, **kw):\n    sys.exit(3)\n")
    (tmp_path / "quits.py").write_text(body)
    name = f"{tmp_path / 'quits.py'}:r"
    out = tmp_path / "run"
    assert cli.main(["--config", SMOKE, *_sets(out, 1), "--set", f'rewards=[{{name="{name}", weight=1.0}}]']) == 2
    _one_line_error(capsys, f"reward {name!r}" if where == "import" else "reward 'r' raised SystemExit")


def test_a_reward_file_not_ending_in_py_is_one_line(tmp_path, capsys):
    (tmp_path / "r.txt").write_text("def r(p, c, a, **kw):\n    return [0.0] * len(c)\n")
    name = f"{tmp_path / 'r.txt'}:r"
    assert cli.main(["--config", SMOKE, *_sets(tmp_path / "run", 1),
                     "--set", f'rewards=[{{name="{name}", weight=1.0}}]']) == 2
    _one_line_error(capsys, "is not a .py file")


def test_a_profile_with_a_byte_order_mark_loads(tmp_path):
    profile = tmp_path / "bom.toml"
    profile.write_bytes(b"\xef\xbb\xbf" + b"seed = 7\n")
    assert load_config(profile).seed == 7


# --- a stop asked for in the last step ----------------------------------------------------------

def test_sigint_in_the_last_step_finishes_the_run_with_exit_0_and_no_resume_hint(tmp_path, capsys, monkeypatch):
    import mlx_grpo.rollout.score as score
    from mlx_grpo.run.log import read_metrics

    real, calls = score.generate_completions, []

    def generate(*args, **kwargs):  # SIGINT while the second (last) step generates
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(score, "generate_completions", generate)
    out = tmp_path / "run"
    assert cli.main(["--config", SMOKE, *_sets(out, 2)]) == 0
    err = capsys.readouterr().err
    assert "resume with" not in err and "stopped by" not in err, err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers put back
    assert [r["step"] for r in read_metrics(out)] == [1, 2]
    assert (out / "checkpoints" / "step_000002" / "checkpoint_manifest.json").is_file()


# --- SIGTERM in a step that cannot finish soon ----------------------------------------------------

def _stop_in(steps, signal_at, grace=0.5):
    """Run `steps` abandonable steps of the given seconds (busy Python, as a decode loop is) under
    a StopRequest with GRACE_S = grace, sending SIGTERM `signal_at` seconds into the last;
    returns (steps finished, seconds from the signal to the end, the StopRequest)."""
    import threading

    from mlx_grpo.run import stopping

    finished, sent = [], []
    old = stopping.GRACE_S
    stopping.GRACE_S = grace
    try:
        with stopping.StopRequest() as stop:
            for i, seconds in enumerate(steps):
                if i == len(steps) - 1:
                    timer = threading.Timer(signal_at, lambda: (sent.append(time.monotonic()),
                                                                os.kill(os.getpid(), signal.SIGTERM)))
                    timer.start()
                try:
                    with stop.abandonable():
                        end = time.monotonic() + seconds
                        while time.monotonic() < end:
                            pass
                except stopping.StepAbandoned:
                    break
                finished.append(i + 1)
    finally:
        stopping.GRACE_S = old
    return finished, time.monotonic() - sent[0], stop


def test_sigterm_abandons_at_once_a_step_the_earlier_ones_say_is_long(capsys):
    finished, took, stop = _stop_in([2.0, 30.0], signal_at=0.3)
    # the step had 29.7 s left: seconds, not the step's end (bounds wide for a loaded machine)
    assert finished == [1] and took < 5.0 and stop.signum == signal.SIGTERM
    # about 2 s less the signal's delay, which a loaded machine stretches
    assert re.search(r"abandoning this step \(about [12] s of it are left by the earlier steps\)",
                     capsys.readouterr().err)
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL  # the grace timer is gone


def test_sigterm_gives_a_step_expected_to_end_soon_the_grace_then_abandons_it(capsys):
    finished, took, _ = _stop_in([0.3, 30.0], signal_at=0.1, grace=0.5)
    assert finished == [1] and 0.5 <= took < 5.0  # the grace, then at once (wide for a loaded machine)
    assert "abandoning this step (it did not finish within" in capsys.readouterr().err
    finished, _, stop = _stop_in([0.3, 0.6], signal_at=0.2, grace=1.0)  # it ends within the grace
    assert finished == [1, 2] and stop.requested


@pytest.mark.slow  # 77 s on a busy 2-core machine, most of it the two slow steps; the unit tests above are fast
def test_sigterm_in_a_long_step_exits_within_seconds_keeping_a_resumable_checkpoint(tmp_path):
    from mlx_grpo.commands.train import train
    from mlx_grpo.run.checkpoint import checkpoint_damage
    from mlx_grpo.run.log import read_metrics

    out = tmp_path / "run"
    # A slow step: at temperature 30 builtin:tiny samples nearly uniform tokens, so some of the 16
    # completions run to all 512 new tokens (each decoded token is one short MLX call).
    slow = ["generation.num_generations=8", "generation.max_new_tokens=512", "generation.temperature=30.0"]
    script = ("import sys\nfrom mlx_grpo.run import stopping\nstopping.GRACE_S = 1.0\n"
              "from mlx_grpo import cli\nsys.exit(cli.main(sys.argv[1:]))\n")
    with open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", script, "train", "--config", SMOKE, *_sets(out, 3, *slow)],
                                stdout=subprocess.DEVNULL, stderr=err)
        manifest = out / "checkpoints" / "step_000001" / "checkpoint_manifest.json"
        while not manifest.exists() and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(0.3)  # into step 2
        proc.send_signal(signal.SIGTERM)
        tic = time.monotonic()
        proc.wait(timeout=120)
        took = time.monotonic() - tic
    err = (tmp_path / "err").read_text()
    assert proc.returncode == 143, err[-3000:]
    assert took < 5, took  # 0.40 s measured here: one decoded token, the summary, the exit
    assert f"stopped by SIGTERM in step 2, which could not finish soon and was abandoned; last checkpoint " \
           f"{out / 'checkpoints' / 'step_000001'}" in err
    assert "resume with: mlx-grpo train" in err
    assert [r["step"] for r in read_metrics(out)] == [1]
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_000001"]
    assert checkpoint_damage(out / "checkpoints" / "step_000001") is None
    resumed = load_config(SMOKE, _sets(out, 2, *slow)[1::2] + ["checkpoint.resume=true"])
    assert train(resumed) == out / "checkpoints" / "step_000002"
    assert [r["step"] for r in read_metrics(out)] == [1, 2]
