"""One process per run folder: an OS lock on `<output_dir>/.lock`, held while a run trains.

`fcntl.flock` locks belong to the open file, so the kernel drops them when the process ends,
however it ends (a SIGKILL included): a stale lock file never blocks a later run. The file
keeps the holder's PID and host, for the message a second process gets.
"""

from contextlib import contextmanager
import fcntl
import os
from pathlib import Path
import socket

from mlx_grpo.errors import TrainingError
from mlx_grpo.run.layout import LOCK


class RunFolderBusy(TrainingError):
    """Another process holds the run folder's lock."""


def _holder(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode("utf-8", "replace").split()
    return f"PID {text[0]} on {text[1]}" if len(text) >= 2 else "another process"


@contextmanager
def lock_run_folder(output_dir):
    """Hold `<output_dir>/.lock` for the block; raise RunFolderBusy at once if it is taken."""
    out = Path(output_dir)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    locked = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderBusy(
                f"output_dir: {out} is in use by {_holder(fd)} (lock {out / LOCK}); "
                "wait for that run to end or choose another output_dir"
            ) from None
        locked = True
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        # A run that stopped before writing anything leaves no folder behind if it made it.
        untouched = locked and created and [p.name for p in out.iterdir()] == [LOCK]
        if untouched:
            (out / LOCK).unlink()
        os.close(fd)  # releases the lock; otherwise the file stays, a released lock is harmless
        if untouched:
            out.rmdir()
