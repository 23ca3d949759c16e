"""Running tool calls while the rollout goes on: each call runs on its own daemon thread (an
`async def` tool in its own event loop there), so a slow tool holds up only its own row, and a
call past its timeout is answered with an error and left behind (a thread cannot be killed).
A tool that raises, or returns something that is not text or JSON, becomes an error message
for the model too: faults are part of the episode, never of the run. Pure Python, no MLX.
"""

import asyncio
import inspect
import json
import threading
import time


def _text(value) -> str:
    """A tool's return value as the text of a tool message."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


class Call:
    """One tool call in flight: `result()` is None until it finished or timed out, then
    (text, failed)."""

    def __init__(self, name: str, fn, kwargs: dict, timeout_s: float, clock=time.monotonic):
        self.name, self.timeout_s, self.clock = name, timeout_s, clock
        self.started = clock()
        self.finished_at = None
        self._done = threading.Event()
        self._value = None
        threading.Thread(target=self._run, args=(fn, kwargs), daemon=True, name=f"tool {name}").start()

    def _run(self, fn, kwargs) -> None:
        try:
            out = fn(**kwargs)
            if inspect.isawaitable(out):
                out = asyncio.run(_awaited(out, self.timeout_s))
            self._value = (_text(out), False)
        except asyncio.TimeoutError:
            self._value = (f"Error: tool {self.name!r} timed out after {self.timeout_s:g} s", True)
        except (Exception, SystemExit) as e:  # the model sees what went wrong; the run goes on
            self._value = (f"Error: tool {self.name!r} raised {type(e).__name__}: {' '.join(str(e).split())}", True)
        self.finished_at = self.clock()
        self._done.set()

    def result(self):
        if self._done.is_set():
            return self._value
        if self.clock() - self.started > self.timeout_s:
            return f"Error: tool {self.name!r} timed out after {self.timeout_s:g} s", True
        return None

    def wait(self, seconds: float) -> None:
        """Block until the call is done, its deadline passed, or `seconds` elapsed."""
        left = self.timeout_s - (self.clock() - self.started)
        self._done.wait(max(0.0, min(seconds, left)))


async def _awaited(awaitable, timeout_s: float):
    return await asyncio.wait_for(awaitable, timeout_s)


class Failed:
    """A call that never ran (malformed, unknown tool, bad arguments): its error is its result."""

    def __init__(self, name: str, message: str):
        self.name, self.message = name, message

    def result(self):
        return f"Error: {self.message}", True

    def wait(self, seconds: float) -> None:
        pass
