"""`mlx-grpo launch --check` and the check before every launch (issue 33, item 1): every host
answers with its versions, hashes, backends and memory against the plan; a mismatch or a host
that does not answer is one line naming the host and what differs, before any rank starts.

On one machine a mismatch is made with the probe's test hook (MLX_GRPO_TEST_PROBE_VERSION: rank 1
reports another mlx-grpo version), and an unreachable host is a host file naming a host that
does not resolve (the launcher reaches every host other than 127.0.0.1 through ssh, which fails)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from mlx_grpo.commands.launch_check import describe, probe_command, problems

ROOT = Path(__file__).resolve().parent.parent
TRAIN = [sys.executable, "-m", "mlx_grpo", "train", "--config", "configs/smoke_test.toml",
         "--set", "training.max_steps=1"]


def _launch(*args, env=None):
    return subprocess.run([sys.executable, "-m", "mlx_grpo", "launch", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def _errors(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("mlx-grpo: error:")]


def test_a_version_mismatch_refuses_the_launch_before_any_rank_starts(tmp_path):
    run = tmp_path / "run"
    proc = _launch("-n", "2", "--", *TRAIN, "--set", f'output_dir="{run}"',
                   env={"MLX_GRPO_TEST_PROBE_VERSION": "1:0.0.9"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert _errors(proc) == ["mlx-grpo: error: --check: host 127.0.0.1 (rank 1): mlx-grpo 0.0.9, but 127.0.0.1 "
                             "(rank 0) has 0.1.0"], proc.stderr[-3000:]
    assert not run.exists()  # no rank started


def test_an_unreachable_host_is_one_line_naming_it(tmp_path):
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]},
                                 {"ssh": "mini-9.invalid", "ips": ["127.0.0.2"]}]))
    proc = _launch("--check", "--hostfile", str(hosts))
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = _errors(proc)
    # the reason is ssh's own: "Could not resolve hostname" here, "command not found" without ssh
    assert line.startswith("mlx-grpo: error: --check: host mini-9.invalid (rank 1) did not answer the check: "), line


def test_check_alone_prints_each_hosts_answer_and_launches_nothing(tmp_path):
    run = tmp_path / "run"
    proc = _launch("--check", "-n", "2", "--", *TRAIN, "--set", f'output_dir="{run}"')
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[-1] == "mlx-grpo: check: 2 ranks on 1 host(s) agree"
    assert [line.split(":")[1] for line in lines[:2]] == [" check", " check"]
    for rank, line in enumerate(lines[:2]):
        assert line.startswith(f"mlx-grpo: check: rank {rank} on 127.0.0.1: mlx ")
        assert ", profile " in line and ", backend ring, " in line and " for a planned peak of " in line
    assert not run.exists()


def test_probe_command_replaces_train_with_launch_probe():
    assert probe_command(["mlx-grpo", "train", "--config", "c.toml", "--set", "a=1"], None) == \
        ["mlx-grpo", "launch-probe", "--config", "c.toml", "--set", "a=1"]
    assert probe_command([".venv/bin/mlx-grpo", "--config", "c.toml"], None) == \
        [".venv/bin/mlx-grpo", "launch-probe", "--config", "c.toml"]
    assert probe_command(["py", "-m", "mlx_grpo", "train", "--config", "c.toml"], None) == \
        ["py", "-m", "mlx_grpo", "launch-probe", "--config", "c.toml"]
    # any other command: the versions alone, with the launch's python
    assert probe_command(["py", "-c", "print(1)"], "/opt/py") == ["/opt/py", "-m", "mlx_grpo", "launch-probe"]


ANSWER = {"host": "m1", "mlx": "0.32.4", "mlx_lm": "0.32.2", "mlx_grpo": "0.1.0", "code": "aaa", "commit": "",
          "available_gb": 10.0, "backends": ["ring"], "profile": "ppp", "ignore_memory": False, "peak_gb": 2.0}


def test_problems_name_each_host_and_what_differs():
    assert problems([("m1", ANSWER), ("m2", dict(ANSWER))], "ring") == []
    other = {**ANSWER, "profile": "qqq", "code": "bbb", "available_gb": 1.5, "backends": []}
    assert problems([("m1", ANSWER), ("m2", other), ("m3", "ssh: connect timed out (exit 255)")], "ring") == [
        "host m2 (rank 1): its mlx cannot run the ring backend (it can: none)",
        "host m2 (rank 1): the plan's peak of 2.00 GB is above the 1.50 GB of memory available there (is a rank "
        "of an earlier run still holding it?); --ignore-memory trains anyway",
        "host m2 (rank 1): mlx_grpo package files (hash) bbb, but m1 (rank 0) has aaa",
        "host m2 (rank 1): resolved profile (hash) qqq, but m1 (rank 0) has ppp",
        "host m3 (rank 2) did not answer the check: ssh: connect timed out (exit 255)",
    ]
    assert problems([("m1", ANSWER), ("m2", {**other, "ignore_memory": True, "backends": ["ring"],
                                             "profile": "ppp", "code": "aaa"})], "ring") == []
    assert describe(0, "m1", ANSWER, "ring") == (
        "rank 0 on m1: mlx 0.32.4, mlx-lm 0.32.2, mlx-grpo 0.1.0 (code aaa), profile ppp, backend ring, "
        "10.0 GB available for a planned peak of 2.00 GB")
