"""No silent hang across ranks: every collective has a deadline, and the ranks tell each other how
far they are, so the rank that waits past it can say which rank did not come.

mx.distributed's collectives block in C++ and cannot be interrupted; a rank that stopped (SIGSTOP,
a hung driver, a sleeping Mac, a pulled cable) leaves the others waiting forever, holding their
memory. Here each rank sends a heartbeat over UDP (on the IP its ring host file gives it) to every
other rank once a second and whenever it enters a collective: how many collectives it has entered,
its step, and whether it is busy alone. A `Watch` thread sees a collective this rank has waited
in for longer than the deadline, prints one line naming the ranks that have not entered it,
"lost" when nothing has been heard from them for LOST_AFTER_S (stopped, crashed, hung or cut
off) and "slow" otherwise, and ends the process with os._exit(DEADLINE_EXIT). `mlx-grpo launch`
then kills every other rank at once (a stopped process takes no SIGTERM). The last checkpoint
stays whole: checkpoints are written to a temporary folder and renamed.

The deadline is distributed.timeout_s when set, else the larger of FLOOR_S and STEP_FACTOR times
the median step time so far. The wait is not counted while a rank that has not arrived is heard
from and either busy alone (`busy`: loading its model, rank 0 evaluating or writing a checkpoint)
or still before the end of the first step (compiling, loading: they take what they take).
"""

from contextlib import contextmanager
import json
import os
import socket
import statistics
import sys
import threading
import time

DEADLINE_EXIT = 3  # the exit status of a rank that gave up waiting; `mlx-grpo launch` knows it
FLOOR_S = 60.0  # the least deadline without distributed.timeout_s
STEP_FACTOR = 5.0  # the deadline in median step times
INIT_S = 120.0  # mx.distributed.init must have connected every rank by then (or timeout_s, if longer)
HEARTBEAT_S = 1.0  # each rank tells every other how far it is this often
LOST_AFTER_S = 3.0  # a rank not heard from for this long is lost (stopped, hung or cut off)


def _say(line: str) -> None:
    """One line on stderr, then the process ends at once: the main thread is blocked in C++."""
    resume = os.environ.get("MLX_GRPO_RESUME")
    print(f"mlx-grpo: error: {line}" + (f"; resume with: {resume}" if resume else ""), file=sys.stderr, flush=True)
    os._exit(DEADLINE_EXIT)


@contextmanager
def init_deadline(seconds: float, rank: int, where: str):
    """Around mx.distributed.init, which waits forever for a rank that never connects."""
    timer = threading.Timer(seconds, lambda: _say(
        f"rank {rank}: mx.distributed.init did not connect every rank within {seconds:g} s ({where}); "
        "a host is down or unreachable at that address, or its rank did not start; "
        "`mlx-grpo launch --check` asks each host"))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


class Watch:
    """This rank's heartbeats and the deadline of its collectives (see the module's docstring).
    `peers` holds every rank's (IP, UDP port), this rank's socket already bound to its own."""

    def __init__(self, rank: int, sock: socket.socket, peers: list[tuple[str, int]], timeout_s: float = 0.0):
        self.rank, self.sock, self.peers, self.timeout_s = rank, sock, peers, timeout_s
        self.entered, self.step, self.alone = 0, 0, ""  # collectives entered; the step; busy alone at what
        self.step_times: list[float] = []
        self.waiting: tuple[int, str, float] | None = None  # (collective number, what, counted since)
        self.heard: dict[int, tuple[dict, float]] = {}  # rank -> (its last heartbeat, when)
        self._lock = threading.Lock()
        for loop in (self._send_loop, self._receive_loop, self._watch_loop):
            threading.Thread(target=loop, daemon=True).start()

    def deadline(self) -> float:
        if self.timeout_s > 0:
            return self.timeout_s
        if not self.step_times:
            return FLOOR_S
        return max(FLOOR_S, STEP_FACTOR * statistics.median(self.step_times))

    @contextmanager
    def collective(self, what: str):
        """Around one collective, evaluated inside."""
        with self._lock:
            self.entered += 1
            self.waiting = (self.entered, what, time.monotonic())
        self._beat()
        try:
            yield
        finally:
            self.waiting = None

    @contextmanager
    def busy(self, what: str):
        """While this rank works alone, the others' wait for it is not counted."""
        self.alone = what
        self._beat()
        try:
            yield
        finally:
            self.alone = ""
            self._beat()

    def at_step(self, step: int) -> None:
        self.step = step
        self._beat()

    def step_done(self, seconds: float) -> None:
        self.step_times.append(seconds)

    def _where(self, step: int) -> str:
        return f"step {step}" if step else "the start-up (before step 1)"

    def _beat(self) -> None:
        message = json.dumps({"r": self.rank, "n": self.entered, "s": self.step, "b": self.alone,
                              "t": bool(self.step_times)}).encode()
        for r, address in enumerate(self.peers):
            if r != self.rank:
                try:
                    self.sock.sendto(message, address)
                except OSError:  # a peer's host unreachable for now: the deadline will say so
                    pass

    def _send_loop(self) -> None:
        while True:
            self._beat()
            time.sleep(HEARTBEAT_S)

    def _receive_loop(self) -> None:
        while True:
            try:
                data, _ = self.sock.recvfrom(4096)
                beat = json.loads(data)
                last = self.heard.get(int(beat["r"]))
                if last is None or beat["n"] >= last[0]["n"]:  # a datagram overtaken by a newer one is dropped
                    self.heard[int(beat["r"])] = (beat, time.monotonic())
            except (OSError, ValueError, KeyError, TypeError):
                time.sleep(0.05)  # a stray datagram

    def _missing(self, number: int, now: float) -> list[tuple[int, dict | None, float | None]]:
        """(rank, its last heartbeat, seconds since) of each rank that has not entered collective `number`."""
        out = []
        for r in range(len(self.peers)):
            beat, when = self.heard.get(r, (None, None))
            if r != self.rank and (beat is None or beat["n"] < number):
                out.append((r, beat, None if when is None else now - when))
        return out

    def _watch_loop(self) -> None:
        while True:
            time.sleep(0.1)
            with self._lock:
                if self.waiting is None:
                    continue
                number, what, since = self.waiting
                now = time.monotonic()
                missing = self._missing(number, now)
                # a rank heard from and busy alone, or still in the first step, is waited for
                if any(ago is not None and ago < LOST_AFTER_S and (beat["b"] or not beat["t"])
                       for _, beat, ago in missing):
                    self.waiting = (number, what, now)
                    continue
                if now - since > self.deadline():
                    _say(self._late_line(what, missing, now - since))

    def _late_line(self, what: str, missing: list, waited: float) -> str:
        head = f"rank {self.rank}: "
        if not missing:
            return (head + f"every rank reached the {what} of {self._where(self.step)}, which did not complete within "
                    f"{waited:.0f} s: the link between the ranks is down; every rank stops")
        named = []
        for r, beat, ago in missing:
            if beat is None:
                named.append(f"rank {r} (never heard from: its heartbeats do not arrive)")
            elif ago >= LOST_AFTER_S:
                named.append(f"rank {r} (lost: last heard {ago:.0f} s ago, in {self._where(beat['s'])}: "
                             "stopped, hung or cut off)")
            else:
                named.append(f"rank {r} (slow: still in {self._where(beat['s'])})")
        return (head + f"{', '.join(named)} did not reach the {what} of {self._where(self.step)} within {waited:.0f} s "
                "(distributed.timeout_s); every rank stops, the last checkpoint is whole")
