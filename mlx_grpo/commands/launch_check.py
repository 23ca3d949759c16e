"""`mlx-grpo launch --check` (and the check before every launch): every host answers with
`mlx-grpo launch-probe` (commands/probe.py), started the way its rank would be (same host, python,
working folder and environment), and the answers are compared before any rank starts.

A host that does not answer within PROBE_S (down, no SSH, no mlx-grpo at that path), one whose
mlx, mlx-lm, mlx-grpo, package files or resolved profile differ from rank 0's, one whose mlx
cannot run the backend in use, and one where the profile's planned peak is above the memory
available there (a rank of an earlier run may still hold it) each make one line naming the host
and what differs.
"""

import json
import os
from pathlib import Path
import shlex
import signal
import subprocess
import sys
import time

PROBE_S = 120.0  # the longest a host may take to answer (SSH, then importing MLX on a cold disk)
COMPARED = (("mlx", "mlx"), ("mlx_lm", "mlx-lm"), ("mlx_grpo", "mlx-grpo"),
            ("code", "mlx_grpo package files (hash)"), ("profile", "resolved profile (hash)"))


def probe_command(command: list[str], python: str | None) -> list[str]:
    """The launch-probe command of a rank's command: its `mlx-grpo` (or `python -m mlx_grpo`) with
    `launch-probe` in place of `train`; for any other command, the versions alone."""
    for i, arg in enumerate(command):
        if arg == "-m" and command[i + 1:i + 2] == ["mlx_grpo"]:
            entry, rest = command[:i + 2], command[i + 2:]
            break
        if Path(arg).name == "mlx-grpo":
            entry, rest = command[:i + 1], command[i + 1:]
            break
    else:
        entry, rest = [python or sys.executable, "-m", "mlx_grpo"], []
    rest = rest[1:] if rest[:1] == ["train"] else rest if rest[:1] == ["--config"] else []
    return [*entry, "launch-probe", *rest]


def backend_of(files: dict, env: list[str]) -> str:
    """The backend mlx.launch set the ranks up for, from what it gives them."""
    if "MLX_IBV_DEVICES" in files:
        return "jaccl"
    if any(e.startswith("NCCL_HOST_IP=") for e in env):
        return "nccl"
    return "ring"


def _start(rank: int, host: str, python, cwd, env: list[str], command: list[str]) -> subprocess.Popen:
    from mlx._distributed_utils.launch import RemoteProcess

    local = host == "127.0.0.1"
    script = RemoteProcess.make_launch_script(rank, python, cwd, {}, env, command, True)
    if not local:
        script = shlex.join(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", host, script])
    return subprocess.Popen(script, shell=True, executable="/bin/bash", stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0)


def run_probes(arguments: list[tuple]) -> list[tuple[str, dict | str]]:
    """(host, its answer, or why there is none) for each rank of mlx.launch's `arguments`."""
    started = []
    for (rank, host, python, cwd, files, env, command), _ in arguments:
        started.append((host, _start(rank, host, python, cwd, env, probe_command(command, python))))
    deadline, out = time.monotonic() + PROBE_S, []
    for host, proc in started:
        try:
            stdout, stderr = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            out.append((host, f"no answer within {PROBE_S:.0f} s"))
            continue
        answers = [line for line in stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not answers:
            last = (stderr.strip().splitlines() or ["nothing on stderr"])[-1]
            out.append((host, f"{last} (exit {proc.returncode})"))
        else:
            out.append((host, json.loads(answers[-1])))
    return out


def problems(answers: list[tuple[str, dict | str]], backend: str) -> list[str]:
    """One line per host and difference; none when every host agrees with rank 0's."""
    lines, first = [], answers[0][1]
    for rank, (host, answer) in enumerate(answers):
        who = f"host {host} (rank {rank})"
        if isinstance(answer, str):
            lines.append(f"{who} did not answer the check: {answer}")
            continue
        if "error" in answer:
            lines.append(f"{who}: {answer['error']}")
        if backend not in answer["backends"]:
            lines.append(f"{who}: its mlx cannot run the {backend} backend (it can: "
                         f"{', '.join(answer['backends']) or 'none'})")
        peak, free = answer.get("peak_gb"), answer.get("available_gb")
        if peak is not None and free is not None and peak > free and not answer.get("ignore_memory"):
            lines.append(f"{who}: the plan's peak of {peak:.2f} GB is above the {free:.2f} GB of memory available "
                         "there (is a rank of an earlier run still holding it?); --ignore-memory trains anyway")
        if rank and isinstance(first, dict):
            for key, name in COMPARED:
                if answer.get(key) != first.get(key):
                    lines.append(f"{who}: {name} {answer.get(key)}, but {answers[0][0]} (rank 0) has {first.get(key)}")
    return lines


def describe(rank: int, host: str, answer: dict, backend: str) -> str:
    """A host's answer in one line."""
    commit = f"commit {answer['commit']}, " if answer["commit"] else ""
    memory = f"{answer['available_gb']:.1f} GB available" if answer["available_gb"] is not None else "memory unknown"
    if "peak_gb" in answer:
        memory += f" for a planned peak of {answer['peak_gb']:.2f} GB"
    profile = f", profile {answer['profile']}" if "profile" in answer else ""
    return (f"rank {rank} on {host}: mlx {answer['mlx']}, mlx-lm {answer['mlx_lm']}, mlx-grpo {answer['mlx_grpo']} "
            f"({commit}code {answer['code']}){profile}, backend {backend}, {memory}")


def check(arguments: list[tuple], verbose: bool) -> bool:
    """Probe every host of mlx.launch's `arguments`; print one line per problem on stderr (and,
    `verbose`, one per host and a last one on stdout; a launch that goes ahead says nothing);
    True when all agree."""
    (_, _, _, _, files, env, _), _ = arguments[0]
    backend = backend_of(files, env)
    answers = run_probes(arguments)
    bad = problems(answers, backend)
    for line in bad:
        print(f"mlx-grpo: error: --check: {line}", file=sys.stderr, flush=True)
    if bad:
        return False
    if verbose:
        for rank, (host, answer) in enumerate(answers):
            print(f"mlx-grpo: check: {describe(rank, host, answer, backend)}", flush=True)
        print(f"mlx-grpo: check: {len(answers)} ranks on {len({h for h, _ in answers})} host(s) agree", flush=True)
    return True
