"""No silent hang (issue 33, item 2): a rank stopped with SIGSTOP mid-run makes both ranks of
`mlx-grpo launch -n 2` end within distributed.timeout_s, with one line naming the stopped rank,
no process left behind and the last checkpoint whole; the run then resumes, here under one rank
instead of two, in the same data order (item 3). The launched run also shows the ranks drawing
disjoint prompts that together are the step's. The deadline's own rules are tested on a Watch
without ranks."""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from mlx_grpo import deadline
from mlx_grpo.deadline import Watch
from mlx_grpo.run.checkpoint import newest_intact
from mlx_grpo.run.log import read_metrics

from test_launch_signals import _processes, _wait_for, launched

ROOT = Path(__file__).resolve().parent.parent

# Step 2's reward writes its rank's PID, then waits while a file `hold` is there.
GATE = """import os, time
from pathlib import Path

HERE, calls = Path(__file__).parent, 0

def gate(prompts, completions, answers, **kwargs):
    global calls
    calls += 1
    if calls == 2:
        (HERE / f"in_step_2.{os.environ['MLX_RANK']}").write_text(str(os.getpid()))
        while (HERE / "hold").exists():
            time.sleep(0.01)
    return [0.0] * len(completions)
"""

TIMEOUT_S = 10


def _stream_ids(n: int) -> list[int]:
    """The first n prompt ids of builtin:arithmetic's walk with seed 0 (data/load.PromptStream's
    first epoch: range(995) shuffled by random.Random("0:0"); no prompt is too long to keep)."""
    order = list(range(995))
    random.Random("0:0").shuffle(order)
    return order[:n]


def test_a_stopped_rank_ends_both_within_the_deadline_with_one_line_and_the_run_resumes(tmp_path):
    (tmp_path / "hold").touch()
    with launched(tmp_path, "--set", "checkpoint.save_every=1", "--set", f"distributed.timeout_s={TIMEOUT_S}",
                  reward=GATE) as proc:
        ready = [tmp_path / f"in_step_2.{r}" for r in range(2)]
        _wait_for(lambda: all(p.exists() and p.read_text() for p in ready), proc, tmp_path)
        os.kill(int(ready[1].read_text()), signal.SIGSTOP)
        stopped = time.monotonic()
        (tmp_path / "hold").unlink()  # rank 0 goes on to the step's first collective and waits there
        rc = proc.wait(timeout=TIMEOUT_S + 60)  # a bound against a hang: the deadline plus start-up slack
        ended = time.monotonic() - stopped
        assert _processes(str(tmp_path)) == []  # the stopped rank was killed, not left holding memory
    err = (tmp_path / "err").read_text()
    assert rc == 2, err[-3000:]
    assert ended < TIMEOUT_S + 30, (ended, err[-3000:])
    lines = [line for line in err.splitlines() if line.startswith("mlx-grpo: error:")]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith(
        "mlx-grpo: error: rank 0: rank 1 (lost: last heard "), lines
    assert f"in step 2: stopped, hung or cut off) did not reach the gather of step 2 within {TIMEOUT_S} s" in lines[0]
    assert lines[0].split("; resume with: ")[1].startswith("mlx-grpo launch -n 2 ")

    run = tmp_path / "run"
    assert newest_intact(run)[0].name == "step_000001"
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1]
    ranks = rows[0]["data/prompt_ids"]  # one prompt each of prompts_per_step = 2
    assert len(ranks) == 2 and not set(ranks[0]) & set(ranks[1])
    assert sorted(ranks[0] + ranks[1]) == sorted(_stream_ids(2))

    # resumed under one rank instead of two: the same global order goes on
    resume = subprocess.run(
        [sys.executable, "-m", "mlx_grpo", "train", "--config", str(tmp_path / "profile.toml"),
         "--set", f'output_dir="{run}"', "--set", "checkpoint.save_every=1", "--set", "training.max_steps=2",
         "--resume"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resume.returncode == 0, resume.stderr[-3000:]
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert sorted(rows[1]["data/prompt_ids"][0]) == sorted(_stream_ids(4)[2:])
    state = json.loads((run / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert state["data_position"] == 4


def _watch(timeout_s: float = 0.0, peers: int = 2) -> Watch:
    """Rank 0's Watch with peers at ports nobody reads (its heartbeats go nowhere)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return Watch(0, sock, [("127.0.0.1", sock.getsockname()[1])] * peers, timeout_s)


def test_deadline_is_the_override_or_a_multiple_of_the_median_step_with_a_floor():
    w = _watch()
    assert w.deadline() == deadline.FLOOR_S  # no step timed yet
    for seconds in (2.0, 30.0, 14.0):
        w.step_done(seconds)
    assert w.deadline() == 5 * 14.0  # STEP_FACTOR x the median of 2, 14, 30
    w.step_times = [1.0, 2.0, 3.0]
    assert w.deadline() == deadline.FLOOR_S  # 5 x 2 s is under the floor
    assert _watch(timeout_s=7.5).deadline() == 7.5


def test_late_line_names_lost_slow_and_silent_ranks():
    w = _watch(peers=4)
    w.at_step(6)
    now = 100.0
    w.heard = {1: ({"r": 1, "n": 3, "s": 6, "b": "", "t": True}, now - 12.0),  # silent for 12 s
               2: ({"r": 2, "n": 3, "s": 5, "b": "", "t": True}, now - 0.5),
               3: ({"r": 3, "n": 4, "s": 6, "b": "", "t": True}, now - 0.2)}  # rank 3 arrived
    missing = w._missing(4, now)
    assert [r for r, _, _ in missing] == [1, 2]
    assert w._late_line("gather", missing, 61.0) == (
        "rank 0: rank 1 (lost: last heard 12 s ago, in step 6: stopped, hung or cut off), "
        "rank 2 (slow: still in step 5) did not reach the gather of step 6 within 61 s "
        "(distributed.timeout_s); every rank stops, the last checkpoint is whole")
    w.heard = {}
    assert w._late_line("sum", w._missing(1, now), 60.0).startswith(
        "rank 0: rank 1 (never heard from: its heartbeats do not arrive), rank 2 (never")


def test_init_that_never_connects_ends_with_one_line_and_status_3():
    # mx.distributed.init waits forever for a rank that never starts; here a sleep stands for it
    code = ("import time\nfrom mlx_grpo.deadline import init_deadline\n"
            "with init_deadline(0.5, 1, '127.0.0.1:5000, 127.0.0.1:5001'):\n    time.sleep(60)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "MLX_GRPO_RESUME"})
    assert proc.returncode == deadline.DEADLINE_EXIT
    assert proc.stderr.strip() == (
        "mlx-grpo: error: rank 1: mx.distributed.init did not connect every rank within 0.5 s (127.0.0.1:5000, "
        "127.0.0.1:5001); a host is down or unreachable at that address, or its rank did not start; "
        "`mlx-grpo launch --check` asks each host")
