"""Clean stops: the first SIGINT/SIGTERM becomes a flag the training loop reads once per step.

The loop finishes the step it is in, writes a checkpoint and raises `RunStopped`, which the
CLI turns into a message saying where the checkpoint is and how to resume, and the exit
status 128 + signal number (130 for Ctrl-C, 143 for SIGTERM). After the first signal,
SIGINT goes back to the operating system's default action, so a second Ctrl-C ends the
process at once, even inside a long MLX call. A stop asked for in the last step changes
nothing: that step's checkpoint is the final one, and the run ends as complete, with exit 0.
"""

import signal
import sys

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunStopped(Exception):
    """Training stopped on a signal after writing `checkpoint` at `step`."""

    def __init__(self, signum: int, step: int, checkpoint):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; checkpoint {checkpoint}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopRequest:
    """While `watch(steps)` runs (or inside `with`), SIGINT/SIGTERM set `signum` instead of
    killing the run."""

    def __init__(self):
        self.signum: int | None = None
        self._previous = {}

    def __enter__(self):
        for s in _SIGNALS:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        self.restore()
        return False

    def restore(self):
        """Put back the handlers found on entry (a second call does nothing)."""
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    def watch(self, steps):
        """Yield from `steps` with the handlers installed; the old ones come back at the end,
        also when the loop is left by an exception."""
        with self:
            yield from steps

    def _handle(self, signum, frame):
        if self.signum is None:
            self.signum = signum
            # The next Ctrl-C is handled by the OS: it ends the process wherever it is.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            print(f"\nmlx-grpo: {signal.Signals(signum).name} received; finishing this step and "
                  "writing a checkpoint (Ctrl-C again to quit at once)", file=sys.stderr, flush=True)

    @property
    def requested(self) -> bool:
        return self.signum is not None
