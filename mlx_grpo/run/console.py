"""The training console: one live progress bar at the bottom of the terminal, and above it the
lines a run prints (step lines at logging.log_every, their samples, eval results, warnings).

Every line goes through tqdm.write, which clears the bar, prints the line and draws the bar
again, and stdout is flushed at once: a line left in stdout's buffer while the bar (on stderr)
redraws would later land glued to the bar's text. Log records of the libraries and Python
warnings are sent the same way while the bar is live. No line, the bar included, is wider than
WIDTH columns, so no terminal wraps one under the bar's carriage returns. Inside a step that
takes longer than PROGRESS_AFTER seconds, the bar's postfix shows how far it is: tokens
sampled, then micro-batches updated.

The bar is drawn only on a terminal (show_bar): where stdout or stderr is a pipe or a file (tee,
a log file, a rank under `mlx-grpo launch`) its carriage-return redraws would land in the text,
so there the lines alone are printed. `--no-progress` and TQDM_DISABLE=1 turn it off anywhere.
"""

from contextlib import ExitStack, contextmanager
import logging
import math
import os
import sys
import textwrap
import time
import warnings

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm
from tqdm.utils import disp_len, disp_trim

WIDTH = 99  # columns a printed line may use: every line stays under 100 (fewer in a narrower terminal)
PROGRESS_AFTER = 3.0  # seconds into a step before its inner progress is shown
PROGRESS_EVERY = 0.5  # seconds between two redraws of the inner progress


def fit(text: str, width: int) -> str:
    """`text` cut to `width` display columns, with "..." when something was cut."""
    if disp_len(text) <= width:
        return text
    return disp_trim(text, max(width - 3, 0)) + "..."


def pack(parts: list[str], width: int = WIDTH, indent: str = "    ") -> list[str]:
    """`parts` joined by " | " into lines of at most `width` columns; a part never splits, and
    each line after the first starts with `indent`."""
    lines, current = [], ""
    for part in parts:
        part = fit(part, width - len(indent))
        joined = f"{current} | {part}" if current else part
        if current and disp_len(joined) > width:
            lines.append(current)
            joined = indent + part
        current = joined
    return lines + [current] if current else lines


def wrap(text: str, width: int = WIDTH) -> list[str]:
    """Each line of `text`, broken at spaces into lines of at most `width` columns; a word
    longer than that (a path) goes whole onto a line of its own, to be copied as it is."""
    out = []
    for line in text.split("\n"):
        if disp_len(line) <= width:
            out.append(line)
            continue
        out += textwrap.wrap(line, width, subsequent_indent="    ", break_long_words=False,
                             break_on_hyphens=False, replace_whitespace=False)
    return out


def _capped(screen_shape):
    """tqdm's terminal-size function, its width capped at WIDTH."""
    def shape(fp):
        cols, rows = screen_shape(fp)
        return (min(cols, WIDTH) if cols else WIDTH), rows
    return shape


def cap_width(bar: tqdm) -> tqdm:
    """Keep a dynamic_ncols bar at most WIDTH columns wide (it follows the terminal below that)."""
    if getattr(bar, "dynamic_ncols", None):  # a disabled bar has none
        bar.dynamic_ncols = _capped(bar.dynamic_ncols)
        bar.ncols, bar.nrows = bar.dynamic_ncols(bar.fp)
    return bar


def width() -> int:
    """The columns a line may use here: WIDTH, or the terminal's width when it is narrower."""
    try:
        return min(WIDTH, os.get_terminal_size(sys.stdout.fileno()).columns) or WIDTH
    except (OSError, ValueError, AttributeError):  # not a terminal (a file, a pipe, a test's capture)
        return WIDTH


def say(text: str, file=None) -> None:
    """Print `text` above any live bar, its lines kept within width(), and flush (stdout, or `file`)."""
    file = file or sys.stdout
    for line in wrap(text, width()):
        tqdm.write(line, file=file)
    file.flush()


def on_terminal() -> bool:
    """Whether stdout and stderr both go to a terminal; the bar (on stderr) and the lines (on
    stdout) meet on the screen only then."""
    try:
        return sys.stdout.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a stream without isatty, or a closed one
        return False


def show_bar(wanted: bool = True) -> bool:
    """Whether to draw a progress bar: on a terminal, unless `wanted` is False (--no-progress)
    or TQDM_DISABLE is set to anything but "", "0" or "false" (tqdm reads it only for the bars
    that do not pass `disable` themselves, as ours do)."""
    disabled = os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false")
    return wanted and not disabled and on_terminal()


class Console:
    """The bar over steps first..total and the lines printed above it; a disabled console (ranks
    other than 0) prints nothing. `progress` False (--no-progress) prints the lines alone, as
    does a console whose output is not a terminal (show_bar)."""

    def __init__(self, first: int, total: int, enabled: bool = True, progress: bool = True):
        self.has_bar = enabled and show_bar(progress)
        self.bar = cap_width(tqdm(range(first, total + 1), desc="grpo", dynamic_ncols=True,
                                  initial=first - 1, total=total, disable=not self.has_bar))
        self.enabled = enabled
        self._step, self._started, self._drawn_at, self._phase = 0, 0.0, -math.inf, ""
        self._exits = ExitStack()

    def __iter__(self):
        """The steps, with library logging and warnings printed above the bar meanwhile."""
        with self._exits:
            if self.has_bar:
                # transformers' logger has its own handler and does not pass records up to the root's.
                loggers = [logging.getLogger(), logging.getLogger("transformers")]
                self._exits.enter_context(logging_redirect_tqdm(loggers))
                self._exits.enter_context(_warnings_through_tqdm())
            for step in self.bar:
                self._step, self._started, self._drawn_at, self._phase = step, time.monotonic(), -math.inf, ""
                yield step

    def print(self, text: str) -> None:
        """Print above the bar, each line under WIDTH + 1 columns."""
        if self.enabled:
            say(text)

    def done(self, **postfix) -> None:
        """The step's figures in the bar's postfix, replacing its inner progress."""
        if self.enabled:
            self.bar.set_postfix(postfix)

    def sampling(self, tokens: int, finished: int, sequences: int) -> None:
        """Inner progress of the rollout: tokens sampled so far, sequences finished."""
        self._inner("sampling", f"sampling {tokens:,} tokens, {finished}/{sequences} done",
                    last=finished == sequences)

    def updating(self, done: int, total: int) -> None:
        """Inner progress of the update: micro-batches through forward and backward."""
        self._inner("update", f"update {done}/{total} micro-batches", last=done == total)

    def evaluating(self) -> None:
        self._inner("evaluating", "evaluating", force=True)

    def _inner(self, phase: str, text: str, last: bool = False, force: bool = False) -> None:
        """Redraw the inner progress at most every PROGRESS_EVERY seconds, from PROGRESS_AFTER
        seconds into the step; but once this step shows some, a phase's first and last counts
        are drawn at once: a skipped one would leave the bar showing "sampling 60/128" through
        the whole of an update whose first micro-batch takes many seconds."""
        if not self.has_bar:
            return
        now = time.monotonic()
        shown = bool(self._phase)  # this step's inner progress is on the bar
        due = now - self._started >= PROGRESS_AFTER and now - self._drawn_at >= PROGRESS_EVERY
        if not (force or due or (shown and (last or phase != self._phase))):
            return
        self._drawn_at, self._phase = now, phase
        self.bar.set_postfix_str(f"step {self._step}: {text}")

    def close(self) -> None:
        self.bar.close()


@contextmanager
def _warnings_through_tqdm():
    """Python warnings printed with tqdm.write while the bar is live, not over it."""
    show = warnings.showwarning

    def through(message, category, filename, lineno, file=None, line=None):
        text = warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n")
        tqdm.write(text, file=sys.stderr)

    warnings.showwarning = through
    try:
        yield
    finally:
        warnings.showwarning = show
