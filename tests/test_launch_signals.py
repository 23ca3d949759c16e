"""Signals to `mlx-grpo launch -n 2` (issue 27): every rank stops after the same step, rank 0
with that step's metrics row and its checkpoint; the launch prints one stop line and the launch
command that resumes it, exits 130/143, and leaves no process behind. Each case is a real
launch of two ranks of builtin:tiny on localhost (~20 s here, most of it the three start-ups).

A reward (`gate.py`) holds every rank inside step 2 until the rank has seen the signal, so the
signal always lands mid-step and the run always stops after step 2, whatever the machine's load.
"""

from contextlib import contextmanager
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
import time

import pytest

from mlx_grpo.run.log import read_metrics

from test_distributed import _launch_port

ROOT = Path(__file__).resolve().parent.parent

# Step 2's reward returns once its rank has seen the signal (the stop handler then hands SIGINT
# back to the OS), and with a file `hold` next to it only when the rank is killed.
GATE = """import os, signal, time
from pathlib import Path

HERE, calls = Path(__file__).parent, 0

def gate(prompts, completions, answers, **kwargs):
    global calls
    calls += 1
    if calls == 2:
        (HERE / f"in_step_2.{os.environ['MLX_RANK']}").touch()
        while signal.getsignal(signal.SIGINT) is not signal.SIG_DFL or (HERE / "hold").exists():
            time.sleep(0.01)
    return [0.0] * len(completions)
"""

PROFILE = """[generation]
num_generations = 2
max_new_tokens = 8

[training]
prompts_per_step = 2
max_steps = 4

[checkpoint]
save_every = 10

[logging]
log_completions = 0

[[rewards]]
name = "gate.py:gate"
"""


def _processes(marker: str) -> list[tuple[int, int, str]]:
    """(pid, process group, command line) of every process whose command line names `marker`."""
    ps = subprocess.run(["ps", "-ww", "-eo", "pid=,pgid=,args="], capture_output=True, text=True, check=True).stdout
    rows = [line.split(None, 2) for line in ps.splitlines()]
    return [(int(pid), int(pgid), args) for pid, pgid, args in rows if marker in args and int(pid) != os.getpid()]


@contextmanager
def launched(tmp_path, *extra, reward: str = GATE):
    """A launch of two ranks training with `reward` (gate.py) into tmp_path/run, in a process
    group of its own (as a terminal's foreground job), with its output in tmp_path/out and
    tmp_path/err; every process of it is killed at the end, whatever happened."""
    (tmp_path / "gate.py").write_text(reward)
    (tmp_path / "profile.toml").write_text(PROFILE)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "mlx_grpo", "launch", "-n", "2", "-p", str(_launch_port()), "--",
           sys.executable, "-m", "mlx_grpo", "train", "--config", str(tmp_path / "profile.toml"),
           "--set", f'output_dir="{run}"', *extra]
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, start_new_session=True)
    try:
        yield proc
    finally:
        for pid, pgid, _ in _processes(str(tmp_path)) + [(proc.pid, proc.pid, "")]:
            for kill, target in ((os.killpg, pgid), (os.kill, pid)):
                try:
                    kill(target, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        proc.wait()


def _wait_for(done, proc, tmp_path, seconds: float = 120) -> None:
    """Wait until done() while the launch runs (a bound against a hang, not a timing)."""
    deadline = time.monotonic() + seconds
    while not done():
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()[-3000:]
        time.sleep(0.05)


def _in_step_2(proc, tmp_path) -> None:
    """Wait until both ranks are inside step 2 (each in the gate)."""
    _wait_for(lambda: all((tmp_path / f"in_step_2.{r}").exists() for r in range(2)), proc, tmp_path)


def _ended(proc, tmp_path) -> tuple[int, str, str]:
    """The launch's exit status, stdout and stderr once it has ended; no process of it is left."""
    rc = proc.wait(timeout=60)  # a second or two once the ranks have the signal
    assert _processes(str(tmp_path)) == []  # the launcher waits for every rank
    return rc, (tmp_path / "out").read_text(), (tmp_path / "err").read_text()


def _check_stopped_after_step_2(tmp_path, rc: int, out: str, err: str, name: str) -> str:
    """Rank 0 wrote step 2's row and its checkpoint, the stop is said once; the resume command."""
    run = tmp_path / "run"
    assert rc == 128 + signal.Signals[name], err[-3000:]
    assert [r["step"] for r in read_metrics(run)] == [1, 2]  # no row without its checkpoint
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000002"]
    assert "Traceback" not in err and "Broken pipe" not in err and "error" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("mlx-grpo: ")]  # rank 0's alone
    assert len(lines) == 3 and lines[:2] == [
        f"mlx-grpo: {name} received; finishing this step and writing a checkpoint (Ctrl-C again to quit at once)",
        f"mlx-grpo: stopped by {name} after step 2; checkpoint {run / 'checkpoints' / 'step_000002'}",
    ] and lines[2].startswith("mlx-grpo: resume with: "), err[-3000:]
    assert out.count("mlx-grpo: stopped after step 2 of 4") == 1  # rank 0's summary
    return lines[2].removeprefix("mlx-grpo: resume with: ")


def test_sigterm_to_launch_stops_every_rank_after_the_step_with_a_checkpoint_and_resumes(tmp_path):
    with launched(tmp_path, "--overwrite") as proc:
        _in_step_2(proc, tmp_path)
        proc.send_signal(signal.SIGTERM)  # the launcher alone, as kill, timeout and services do
        again = _check_stopped_after_step_2(tmp_path, *_ended(proc, tmp_path), "SIGTERM")
    # the same launch command, its --overwrite replaced by --resume
    launch = shlex.split(again)
    assert launch[:4] == ["mlx-grpo", "launch", "-n", "2"]
    assert launch[6:] == ["--", sys.executable, "-m", "mlx_grpo", "train", "--config", str(tmp_path / "profile.toml"),
                          "--set", f'output_dir="{tmp_path / "run"}"', "--resume"]

    proc = subprocess.run([sys.executable, "-m", "mlx_grpo", *launch[1:], "--set", "training.max_steps=3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(f"resumed from {tmp_path / 'run' / 'checkpoints' / 'step_000002'} (step 2 of 3)") == 1
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2, 3]


@pytest.mark.parametrize("sent, to_group, name", [
    pytest.param(signal.SIGINT, True, "SIGINT", id="ctrl-c-in-terminal"),  # to the foreground group
    pytest.param(signal.SIGINT, False, "SIGINT", id="kill-INT-launcher", marks=pytest.mark.slow),
    # a closed terminal: the ranks stop as on a SIGTERM
    pytest.param(signal.SIGHUP, True, "SIGTERM", id="terminal-closed", marks=pytest.mark.slow),
])
def test_sigint_or_sighup_to_launch_stops_every_rank_after_the_step(tmp_path, sent, to_group, name):
    with launched(tmp_path) as proc:
        _in_step_2(proc, tmp_path)
        if to_group:
            os.killpg(proc.pid, sent)
        else:
            proc.send_signal(sent)
        again = _check_stopped_after_step_2(tmp_path, *_ended(proc, tmp_path), name)
    assert again.startswith("mlx-grpo launch -n 2 -p ") and again.endswith(" --resume")


@pytest.mark.parametrize("name", ["SIGINT", pytest.param("SIGTERM", marks=pytest.mark.slow)])
def test_a_second_signal_to_launch_kills_every_rank_at_once(tmp_path, name):
    (tmp_path / "hold").touch()  # step 2 would never end by itself
    with launched(tmp_path) as proc:
        _in_step_2(proc, tmp_path)
        proc.send_signal(signal.Signals[name])
        # rank 0 has the first: two signals sent at once may arrive as one
        _wait_for(lambda: "received; finishing this step" in (tmp_path / "err").read_text(), proc, tmp_path, 60)
        proc.send_signal(signal.Signals[name])  # the ranks are still in step 2: the gate holds them
        rc, out, err = _ended(proc, tmp_path)
    assert rc == 128 + signal.Signals[name], err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"mlx-grpo: {name} again: every rank killed at once; the step in progress is lost")
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1]
    assert not (tmp_path / "run" / "checkpoints").exists()


STARTING = """import os, time
from pathlib import Path
(Path(__file__).parent / f"importing.{os.environ['MLX_RANK']}").touch()
time.sleep(600)  # loading the rewards, before the training loop
"""


def _starting(proc, tmp_path) -> None:
    """Wait until both ranks are loading STARTING."""
    _wait_for(lambda: all((tmp_path / f"importing.{r}").exists() for r in range(2)), proc, tmp_path)


@pytest.mark.slow  # ~15 s here
def test_sigterm_to_launch_while_the_ranks_start_up_ends_them_with_one_line(tmp_path):
    with launched(tmp_path, reward=STARTING) as proc:
        _starting(proc, tmp_path)
        proc.send_signal(signal.SIGTERM)
        rc, out, err = _ended(proc, tmp_path)
    assert rc == 143
    assert err.strip().splitlines()[-1] == ("mlx-grpo: stopped by SIGTERM outside the training loop (starting up "
                                            "or winding up); no checkpoint was written for the stop"), err[-3000:]
    assert "Traceback" not in err and not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow  # ~15 s here
def test_a_rank_killed_from_outside_fails_the_launch_and_stops_the_other(tmp_path):
    with launched(tmp_path, reward=STARTING) as proc:
        _starting(proc, tmp_path)
        rank = next(pid for pid, _, args in _processes(str(tmp_path)) if " launch " not in args)
        os.kill(rank, signal.SIGTERM)  # no stop handler yet: it dies of it
        rc, out, err = _ended(proc, tmp_path)
    assert rc == 2
    assert err.strip().splitlines()[-1] == ("mlx-grpo: error: the launch failed: rank 0 was stopped, rank 1 was "
                                            "stopped; each rank's own line above says why"), err[-3000:]


def test_the_resume_command_is_the_launch_command_with_resume_for_overwrite():
    from mlx_grpo.commands.launch import resume_command

    command = ["mlx-grpo", "train", "--config", "my profile.toml", "--overwrite"]
    assert resume_command(["-n", "2"], command) == \
        "mlx-grpo launch -n 2 -- mlx-grpo train --config 'my profile.toml' --resume"
    assert resume_command(["--hostfile", "h.json"], ["mlx-grpo", "train", "--resume", "--config", "c.toml"]) == \
        "mlx-grpo launch --hostfile h.json -- mlx-grpo train --resume --config c.toml"
