"""One process per run folder: an OS lock on `<output_dir>/.lock`, held while a run trains.

The lock is a POSIX record lock (`fcntl.lockf`), which belongs to the process that took it:
the kernel drops it when that process ends, however it ends (a SIGKILL included), and a child
the run forks (a reward function that starts a worker) does not inherit it, so a child that
outlives a killed run never keeps `--resume` out. (`flock` and OFD locks would follow the open
file into such a child.) A record lock does not conflict with its own process, and closing any
descriptor of the file releases it, so a second lock of the same folder in this process is
refused before the file is opened again. The file keeps the holder's PID and host, for the
message a second process gets.
"""

from contextlib import contextmanager
import fcntl
import os
from pathlib import Path
import socket

from mlx_grpo.errors import TrainingError, naming
from mlx_grpo.run.layout import LOCK

_HELD: set[tuple[int, int]] = set()  # (device, inode) of the lock files this process holds


class RunFolderBusy(TrainingError):
    """Another process holds the run folder's lock."""


def _holder(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode("utf-8", "replace").split()
    return f"PID {text[0]} on {text[1]}" if len(text) >= 2 else "another process"


def _busy(out: Path, holder: str) -> RunFolderBusy:
    return RunFolderBusy(f"output_dir: {out} is in use by {holder} (lock {out / LOCK}); "
                         "wait for that run to end or choose another output_dir")


def _held_here(lock: Path) -> bool:
    try:
        stat = os.stat(lock)
    except FileNotFoundError:
        return False
    return (stat.st_dev, stat.st_ino) in _HELD


def _take(fd: int, out: Path) -> tuple[int, int]:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES, as the system reports a held lock
        raise _busy(out, _holder(fd)) from None
    stat = os.fstat(fd)
    _HELD.add((stat.st_dev, stat.st_ino))
    return stat.st_dev, stat.st_ino


def _make_folder(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # mkdir's own message names no setting
        file = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), out)
        raise TrainingError(f"output_dir: {out} cannot be a folder: {file} is a file; "
                            "choose another output_dir") from None


@contextmanager
def lock_run_folder(output_dir):
    """Hold `<output_dir>/.lock` for the block; raise RunFolderBusy at once if it is taken."""
    out = Path(output_dir)
    created = not out.exists()
    _make_folder(out)
    if _held_here(out / LOCK):  # not even opened: closing any copy of it here would release the lock
        raise _busy(out, f"PID {os.getpid()} on {socket.gethostname()} (this process)")
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    key = None
    try:
        key = _take(fd, out)
        with naming(out / LOCK):  # a full disk: the one-line error names the file
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        # A run that stopped before writing anything leaves no folder behind if it made it.
        untouched = key is not None and created and [p.name for p in out.iterdir()] == [LOCK]
        if untouched:
            (out / LOCK).unlink()
        # Closing releases the lock (a record lock goes with any close of the file in this
        # process; nothing else here opens it). The file stays: a released lock is harmless.
        os.close(fd)
        _HELD.discard(key)
        if untouched:
            out.rmdir()
