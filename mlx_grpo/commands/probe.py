"""`mlx-grpo launch-probe`: one host's answer to `mlx-grpo launch --check`, as one JSON line.

`mlx-grpo launch` runs it on every host, with the rank's own `mlx-grpo train` arguments, before
any rank starts (commands/launch_check.py compares the answers): the versions of mlx, mlx-lm and
mlx-grpo, a hash of the mlx_grpo package's files (and the git commit, when it is a checkout), a
hash of the resolved profile, which mx.distributed backends this mlx can run, the memory
available on the host and the peak `mlx-grpo plan` predicts for the profile there.

Test hook (tests only): MLX_GRPO_TEST_PROBE_VERSION="RANK:VERSION" makes the rank RANK report
mlx-grpo VERSION, so that a version mismatch can be tested on one machine.
"""

import argparse
import hashlib
import json
import os
from pathlib import Path
import socket
import subprocess
import sys

import mlx_grpo
from mlx_grpo.errors import UserError

BACKENDS = ("ring", "jaccl", "mpi", "nccl")
TEST_VERSION_ENV = "MLX_GRPO_TEST_PROBE_VERSION"


def package_hash() -> str:
    """sha256 of the mlx_grpo package's .py files (paths and bytes), 12 hex digits."""
    root = Path(mlx_grpo.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def git_commit() -> str:
    """The checkout's commit (12 hex digits), or "" where the package is not in a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(mlx_grpo.__file__).parent,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()[:12] if out.returncode == 0 else ""


def available_memory_gb() -> float | None:
    """Memory a new process can have without swapping: Linux's MemAvailable, macOS's free,
    inactive, purgeable and speculative pages; None elsewhere."""
    try:
        if sys.platform == "darwin":
            text = subprocess.run(["vm_stat"], capture_output=True, text=True, timeout=10).stdout
            page = int(text.split("page size of ")[1].split()[0])
            counts = {line.split(":")[0]: int(line.split(":")[1].strip(" .")) for line in text.splitlines()[1:]
                      if ":" in line and line.split(":")[1].strip(" .").isdigit()}
            kinds = ("Pages free", "Pages inactive", "Pages purgeable", "Pages speculative")
            return sum(counts.get(k, 0) for k in kinds) * page / 1e9
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / 1e9
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        pass
    return None


def _plan(train_args: list[str]) -> dict:
    """The profile's hash and the plan's peak on this host, from the rank's train arguments."""
    from mlx_grpo.commands import train
    from mlx_grpo.commands.plan import MemoryPlanError, plan
    from mlx_grpo.config import config_to_dict, load_config

    parser = argparse.ArgumentParser(prog="mlx-grpo train", add_help=False)
    train.add_arguments(parser)
    args = parser.parse_args(train_args)
    cfg = load_config(args.config, args.overrides)
    resolved = json.dumps(config_to_dict(cfg), sort_keys=True, default=str)
    out = {"profile": hashlib.sha256(resolved.encode()).hexdigest()[:12], "ignore_memory": args.ignore_memory}
    try:
        out["peak_gb"] = plan(cfg, args.memory_gb)["peak_gb"]
    except MemoryPlanError as e:  # e.g. a hub model not in this host's cache: not checked, as train does
        out["plan_error"] = str(e)
    return out


def probe(train_args: list[str]) -> dict:
    """This host's answer (see the module's docstring)."""
    import mlx.core as mx
    import mlx_lm

    rank = os.environ.get("MLX_RANK", "")
    version = mlx_grpo.__version__
    hook = os.environ.get(TEST_VERSION_ENV, "")
    if hook and hook.split(":", 1)[0] == rank:
        version = hook.split(":", 1)[1]
    out = {"host": socket.gethostname(), "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "mlx_grpo": version,
           "code": package_hash(), "commit": git_commit(), "available_gb": available_memory_gb(),
           "backends": [b for b in BACKENDS if mx.distributed.is_available(b)]}
    if train_args:
        try:
            out.update(_plan(train_args))
        except (UserError, OSError) as e:
            out["error"] = str(e)
        except SystemExit:  # argparse said why on stderr
            out["error"] = f"the rank's train arguments do not parse: {' '.join(train_args)}"
    return out


def add_arguments(parser):
    parser.add_argument("train_args", nargs=argparse.REMAINDER, metavar="TRAIN_ARGS",
                        help="the rank's `mlx-grpo train` arguments (--config FILE --set ...), if any")


def main(args) -> int:
    rest = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    print(json.dumps(probe(rest)), flush=True)
    return 0
