"""Clean stops: the first SIGINT/SIGTERM becomes a flag the training loop reads once per step.

The loop finishes the step it is in, writes a checkpoint and raises `RunStopped`, which the
CLI turns into a message saying where the checkpoint is and how to resume, and the exit
status 128 + signal number (130 for Ctrl-C, 143 for SIGTERM). After the first signal,
SIGINT goes back to the operating system's default action, so a second Ctrl-C ends the
process at once, even inside a long MLX call. A stop asked for in the last step changes
nothing: that step's checkpoint is the final one, and the run ends as complete, with exit 0.

SIGTERM is what a machine sends before it shuts down, and what `kill`, `timeout` and container
runtimes send, usually with a SIGKILL some seconds later: a step that cannot finish soon is
abandoned. While the loop is inside `abandonable()` (the step's sampling and update, never a
checkpoint write), a SIGTERM ends the step at once when the earlier steps say more than
GRACE_S seconds of it are left, and otherwise after GRACE_S seconds if it has not finished
by then. The step's work is discarded (nothing of it was written) and the last checkpoint
stays the one to resume from. The exception comes between two Python statements, so a single
MLX call in progress (one decoded token, one micro-batch's forward and backward) ends first.

Of the ranks of a launched run (`mlx-grpo launch`, which passes each rank its signals), rank 0
alone says anything: a stop is announced once.

A step with a NaN or inf loss or gradient is skipped, or stops the run past
training.max_bad_steps (`skip_or_stop`).
"""

from contextlib import contextmanager
import signal
import statistics
import sys
import time

from mlx_grpo.errors import NonFiniteError, TrainingError
from mlx_grpo.run.console import say

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_S = 5.0  # the longest a SIGTERM waits for a step to end by itself


class RunStopped(Exception):
    """Training stopped on a signal after writing `checkpoint` at `step`; with `abandoned`, the
    step after it was started and given up; with `quiet` (a rank other than 0), it goes unsaid."""

    def __init__(self, signum: int, step: int, checkpoint, abandoned: bool = False, quiet: bool = False):
        self.signum, self.step, self.checkpoint, self.quiet = signum, step, checkpoint, quiet
        name = signal.Signals(signum).name
        if abandoned:
            last = f"last checkpoint {checkpoint}" if checkpoint else "no checkpoint written yet"
            super().__init__(f"stopped by {name} in step {step + 1}, which could not finish soon and was "
                             f"abandoned; {last}")
        else:
            super().__init__(f"stopped by {name} after step {step}; checkpoint {checkpoint}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StepAbandoned(BaseException):
    """A SIGTERM ended the step; BaseException, as KeyboardInterrupt, so that no `except
    Exception` on the way (a reward's error wrapper) turns it into another error."""


class StopRequest:
    """While `watch(steps)` runs (or inside `with`), SIGINT/SIGTERM set `signum` instead of
    killing the run; with `can_abandon`, a SIGTERM inside `abandonable()` may end the step
    (raising StepAbandoned there); with `quiet`, nothing is printed."""

    def __init__(self, can_abandon: bool = True, quiet: bool = False):
        self.signum: int | None = None
        self.can_abandon, self.quiet = can_abandon, quiet
        self._previous = {}
        self._work_started: float | None = None  # inside abandonable() since then
        self._durations: list[float] = []  # of the earlier steps' abandonable parts
        self._armed, self._alarm_previous = False, None  # the grace timer, and SIGALRM's handler before it

    def __enter__(self):
        for s in _SIGNALS:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        self.restore()
        return False

    def restore(self):
        """Put back the handlers found on entry (a second call does nothing)."""
        self._disarm()
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    def watch(self, steps):
        """Yield from `steps` with the handlers installed; the old ones come back at the end,
        also when the loop is left by an exception."""
        with self:
            yield from steps

    @contextmanager
    def abandonable(self):
        """The part of a step a SIGTERM may end: it raises StepAbandoned in there."""
        self._work_started = time.perf_counter()
        try:
            yield
        finally:
            self._durations.append(time.perf_counter() - self._work_started)
            self._work_started = None
            self._disarm()

    def expected_left(self) -> float | None:
        """Seconds the current step should still take by the median of the last five, or None
        before any step has finished."""
        if self._work_started is None or not self._durations:
            return None
        return statistics.median(self._durations[-5:]) - (time.perf_counter() - self._work_started)

    def _handle(self, signum, frame):
        first = self.signum is None
        if first:
            self.signum = signum
            # The next Ctrl-C is handled by the OS: it ends the process wherever it is.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        if signum == signal.SIGTERM and self.can_abandon and self._work_started is not None:
            left = self.expected_left()
            if left is not None and left > GRACE_S:
                self._abandon(f"about {left:.0f} s of it are left by the earlier steps")
            self._arm()
            if first and not self.quiet:
                print(f"\nmlx-grpo: SIGTERM received; this step has {GRACE_S:g} s to finish, or it is "
                      "abandoned and the last checkpoint stays", file=sys.stderr, flush=True)
            return
        if first and not self.quiet:
            print(f"\nmlx-grpo: {signal.Signals(signum).name} received; finishing this step and "
                  "writing a checkpoint (Ctrl-C again to quit at once)", file=sys.stderr, flush=True)

    def _arm(self):
        if not self._armed:  # a second SIGTERM does not extend the grace
            self._armed, self._alarm_previous = True, signal.signal(signal.SIGALRM, self._timeout)
            signal.setitimer(signal.ITIMER_REAL, GRACE_S)

    def _disarm(self):
        if self._armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._alarm_previous if self._alarm_previous is not None else signal.SIG_DFL)
            self._armed = False

    def _timeout(self, signum, frame):
        if self._work_started is not None:
            self._abandon(f"it did not finish within {GRACE_S:g} s")

    def _abandon(self, why: str):
        self._disarm()
        print(f"\nmlx-grpo: SIGTERM received; abandoning this step ({why}); the last checkpoint stays",
              file=sys.stderr, flush=True)
        raise StepAbandoned()

    @property
    def requested(self) -> bool:
        return self.signum is not None


def skip_or_stop(error: NonFiniteError, step: int, bad_steps: int, max_bad: int, ckpt) -> int:
    """Count one bad step; past training.max_bad_steps stop, naming step, metric and checkpoint."""
    bad_steps += 1
    last = f"last good checkpoint {ckpt}" if ckpt else "no checkpoint written yet"
    if bad_steps > max_bad:
        raise TrainingError(
            f"step {step}: non-finite {error.metric} ({error.value}), the update was not applied; "
            f"{last}; training.max_bad_steps = {max_bad} allows skipping that many bad steps"
        ) from error
    say(f"mlx-grpo: step {step}: non-finite {error.metric} ({error.value}); update skipped "
        f"({bad_steps} of training.max_bad_steps = {max_bad})")
    return bad_steps
