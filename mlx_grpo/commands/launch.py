"""`mlx-grpo launch`: mlx.launch's options and hosts, with its ranks run to a clean end.

mlx.launch (mlx 0.32) exits 0 whatever its ranks do, and leaves them behind on a signal:
SIGTERM ends the launcher at once (rank 0 then dies of a broken pipe on its next line of output,
between a step's metrics row and its checkpoint), SIGINT stops the output while the ranks train
on unseen. This parses the same options and starts each rank with the same script (mlx's own
code), then runs the ranks itself (`run_ranks`), after asking every host whether it can
(launch_check.py; `--check` asks and launches nothing, `--no-check` skips it):

- each rank in a process group of its own, so a Ctrl-C in the terminal reaches the launcher
  alone, and each rank gets every signal once, from the launcher;
- the launcher's first SIGINT or SIGTERM goes on to every rank, which finish the same step,
  rank 0 writing its checkpoint, and exit 130 or 143; rank 0 prints where it stopped and the
  launch command that resumes it (set in MLX_GRPO_RESUME). The ranks' output is passed on until
  they have all exited, and the launch exits as they did;
- a second SIGINT or SIGTERM kills every rank's process group; a SIGHUP stops them as a SIGTERM;
- a rank that fails (killed, or an exit other than 0, 130 or 143) makes the others stop
  (SIGTERM), as mlx.launch does, and the launch exits 2 with one line saying how each rank
  ended, below each rank's own one-line reason (a rank that stopped cleanly does not). A rank
  still running KILL_AFTER_S later is killed (a stopped process never handles a SIGTERM);
- a rank that gave up waiting at a collective (deadline.py: exit DEADLINE_EXIT, its one line
  names the rank that did not come) has every other rank killed at once, stopped or blocked as
  they are, and the launch exits 2 with no line of its own.
"""

import argparse
import os
import select
import shlex
import signal
import subprocess
import sys
import time

from mlx_grpo.commands.launch_check import check
from mlx_grpo.deadline import DEADLINE_EXIT
from mlx_grpo.distributed import RESUME_ENV
from mlx_grpo.errors import UserError

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# A closed terminal's SIGHUP reaches the launcher alone: the ranks stop as on a SIGTERM.
_PASSED_ON = {signal.SIGHUP: signal.SIGTERM}
_STOPPED = {128 + signal.SIGINT, 128 + signal.SIGTERM}  # a rank that stopped on a signal, cleanly or not
KILL_AFTER_S = 30.0  # after a failure, the other ranks' time to end on their SIGTERM


class LaunchError(UserError):
    """A rank of a launched run failed."""


class Rank:
    """One rank's process, in a process group of its own: the rank itself (its launch script
    ends by exec-ing the command), or for another host the ssh that runs it there."""

    def __init__(self, rank: int, host: str, python, cwd, files: dict, env: list[str], command: list[str]):
        from mlx._distributed_utils.launch import RemoteProcess

        self.rank, self.host, self.local = rank, host, host == "127.0.0.1"
        script = RemoteProcess.make_launch_script(rank, python, cwd, files, env, command, self.local)
        if not self.local:
            script = f"ssh -tt -o LogLevel=QUIET {shlex.quote(host)} {shlex.quote(script)}"
        self.proc = subprocess.Popen(script, shell=True, executable="/bin/bash", stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0)
        # each open output: its pipe and where it goes
        self.outputs = {p.fileno(): (p, out) for p, out in ((self.proc.stdout, sys.stdout.buffer),
                                                             (self.proc.stderr, sys.stderr.buffer))}
        self._stdout = self.proc.stdout.fileno()
        self.pidfile, self._head = None, b""  # the script's first line: the file holding the rank's PID
        # each pipe's unfinished line: ranks run unbuffered (print writes its pieces one by one), and
        # whole lines keep two ranks' output from interleaving within a line
        self._partial = {fd: b"" for fd in self.outputs}
        self.stopped = 0.0  # when the launcher stopped it after another rank failed (0: it did not)

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    @property
    def failed(self) -> bool:
        """Ended, neither complete nor stopped cleanly (killed by a signal counts as failed)."""
        return self.proc.poll() not in (None, 0, *_STOPPED)

    @property
    def exit_code(self) -> int:
        """As a shell reports it: 128 + N for a process killed by signal N."""
        code = self.proc.wait()
        return 128 - code if code < 0 else code

    def read(self, fd: int) -> None:
        """Pass on what the rank wrote to `fd`; at its end, close it."""
        data = os.read(fd, 65536)
        if not data:
            self.close(fd)
            return
        if fd == self._stdout and self.pidfile is None:
            self._head += data
            if b"\n" not in self._head:
                return
            line, _, data = self._head.partition(b"\n")
            self.pidfile = line.decode(errors="replace").strip()
        data = self._partial[fd] + data
        end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        self._partial[fd] = data[end:]
        _write(self.outputs[fd][1], data[:end])

    def close(self, fd: int) -> None:
        _write(self.outputs[fd][1], self._partial.pop(fd))  # a last line with no newline
        self.outputs.pop(fd)[0].close()
        if not self.outputs:
            self.proc.stdin.close()

    def send(self, signum: int) -> None:
        """Signal the rank itself (as `kill` does one process), wherever it runs."""
        if not self.running:
            return
        if self.local or not self.pidfile:  # a remote rank not yet started: ending ssh ends it
            os.kill(self.proc.pid, signum)
            return
        kill = f"kill -s {signal.Signals(signum).name[3:]} $(cat {shlex.quote(self.pidfile)})"
        try:
            subprocess.run(["ssh", self.host, kill], capture_output=True, timeout=30, check=True)
        except (subprocess.SubprocessError, OSError):
            os.kill(self.proc.pid, signal.SIGTERM)  # ssh's end hangs the remote rank up

    @property
    def missed_deadline(self) -> bool:
        return self.proc.poll() == DEADLINE_EXIT

    def kill(self) -> None:
        """End the rank's process group at once (a remote rank is hung up when its ssh ends)."""
        if self.running and not self.local:
            self.send(signal.SIGKILL)  # a stopped remote rank does not end with its ssh
        if self.running:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _write(out, data: bytes) -> None:
    try:
        out.write(data)
        out.flush()
    except OSError:  # the launcher's own output was closed: keep draining the ranks' regardless
        pass


def _pump(ranks: list[Rank], timeout: float) -> None:
    """Pass on the output each rank has written within `timeout` seconds; close the outputs of a
    rank that had ended before and has nothing left to read (a process it left behind may
    hold them open)."""
    ended = [r for r in ranks if not r.running]
    fds = {fd: r for r in ranks for fd in r.outputs}
    if not fds:  # ranks still running with their outputs closed
        time.sleep(timeout)
        return
    readable = select.select(list(fds), [], [], timeout)[0]
    for fd in readable:
        fds[fd].read(fd)
    for r in ended:
        for fd in [fd for fd in r.outputs if fd not in readable]:
            r.close(fd)


def _stop_after_failure(ranks: list[Rank]) -> None:
    """After a rank failed: SIGTERM to the others, as mlx.launch does, and a kill KILL_AFTER_S later;
    at once after a missed deadline (the others are blocked or stopped)."""
    if any(r.missed_deadline for r in ranks):
        for r in ranks:
            r.kill()
    elif not any(r.stopped for r in ranks) and any(r.failed for r in ranks):
        for r in ranks:
            if r.running:
                r.stopped = time.monotonic()
                r.send(signal.SIGTERM)
    for r in ranks:
        if r.stopped and r.running and time.monotonic() - r.stopped > KILL_AFTER_S:
            r.kill()


def run_ranks(arguments: list[tuple]) -> tuple[list[Rank], list[int]]:
    """Start a Rank for each of `arguments` and run them all to their end, as the module's
    docstring says; returns them and the signals the launcher received."""
    received, handled = [], 0
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in _SIGNALS}
    ranks = []
    try:
        for args, kwargs in arguments:
            ranks.append(Rank(*args, **kwargs))
        while any(r.running or r.outputs for r in ranks):
            for signum in received[handled:]:
                if handled == 0:  # once: the ranks stop after the same step
                    for r in ranks:
                        r.send(_PASSED_ON.get(signum, signum))
                else:
                    print(f"\nmlx-grpo: {signal.Signals(signum).name} again: every rank killed at once; the "
                          "step in progress is lost", file=sys.stderr, flush=True)
                    for r in ranks:
                        r.kill()
                handled += 1
            _stop_after_failure(ranks)
            _pump(ranks, 0.1)
    finally:
        for r in ranks:  # on an error of the launcher's own, too: no rank left behind
            r.kill()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return ranks, list(received)


def resume_command(options: list[str], command: list[str]) -> str:
    """The launch command line that resumes the run `command` trains."""
    again = [arg for arg in command if arg != "--overwrite"]
    again += [] if "--resume" in again else ["--resume"]
    return shlex.join(["mlx-grpo", "launch", *options, "--", *again])


def _check_flags(argv: list[str]) -> tuple[list[str], bool, bool]:
    """(argv without --check and --no-check, --check given, --no-check given): flags of this
    launcher's own, among mlx.launch's options (before the `--` that starts the command)."""
    end = argv.index("--") if "--" in argv else len(argv)
    options = argv[:end]
    rest = [a for a in options if a not in ("--check", "--no-check")] + argv[end:]
    if "--check" in options and end == len(argv):  # no command: probe the hosts for their versions
        rest += ["--", sys.executable, "-m", "mlx_grpo", "launch-probe"]
    return rest, "--check" in options, "--no-check" in options


def launch(argv: list[str]) -> int:
    """Run mlx.launch's options and command in `argv` as the module's docstring says, after
    `launch_check.check` unless --no-check; with --check, the check alone. The exit status: 0, 2
    when the check fails, or the ranks' 130/143 after a stop. Raise LaunchError naming the ranks
    that failed."""
    from mlx._distributed_utils import launch as mlx_launch

    argv, check_only, no_check = _check_flags(argv)
    ranks, signals, refused = [], [], []

    def run(command_class, arguments, verbose):  # in place of mlx.launch's own I/O loop
        if not no_check and not check(arguments, verbose=check_only):
            refused.append(True)
        if check_only or refused:
            return
        with_resume = []
        for (*head, env, command), kwargs in arguments:  # (rank, host, python, cwd, files, env, command)
            options = argv[:len(argv) - len(command)]
            again = resume_command(options[:-1] if options[-1:] == ["--"] else options, command)
            with_resume.append(((*head, [*env, f"{RESUME_ENV}={again}"], command), kwargs))
        ended, received = run_ranks(with_resume)
        ranks.extend(ended)
        signals.extend(received)

    def mpi(parser, hosts, args, command):
        if check_only:
            raise LaunchError("--check: the mpi backend starts its ranks through mpirun, which this check cannot probe")
        launch_mpi(parser, hosts, args, command)

    saved = mlx_launch._launch_with_io, mlx_launch.launch_mpi, sys.argv
    launch_mpi = saved[1]
    mlx_launch._launch_with_io, mlx_launch.launch_mpi, sys.argv = run, mpi, ["mlx.launch", *argv]
    try:
        mlx_launch.main()
    finally:
        mlx_launch._launch_with_io, mlx_launch.launch_mpi, sys.argv = saved
    if refused:
        return 2
    return _exit_status(ranks, signals)


def _exit_status(ranks: list[Rank], signals: list[int]) -> int:
    """The launch's exit status from its ranks' (see `launch`)."""
    codes = [r.exit_code for r in ranks]
    if len(signals) > 1:
        return 128 + signals[-1]
    if DEADLINE_EXIT in codes:  # that rank's line named the rank that did not come
        return 2
    # a rank killed by the launcher's own signal (before its stop handler was set) did not fail
    if any(c not in (0, *_STOPPED) for c in codes) or (not signals and any(r.failed for r in ranks)):
        # Which rank failed first is not known here: the others are stopped when one ends, and
        # a rank that was already exiting may then count as stopped.
        ends = ", ".join(f"rank {r.rank} " + ("was stopped" if c in _STOPPED or r.proc.returncode < 0
                                              else f"exited with code {c}") for r, c in zip(ranks, codes) if c)
        raise LaunchError(f"the launch failed: {ends}; each rank's own line above says why")
    if signals and ranks and ranks[0].proc.returncode < 0:  # the signal ended it: it had no stop handler
        print(f"mlx-grpo: stopped by {signal.Signals(signals[0]).name} outside the training loop (starting up "
              "or winding up); no checkpoint was written for the stop", file=sys.stderr)
    return max(codes, default=0)  # 0, or 130/143 when the ranks stopped on a signal


def add_arguments(parser):
    parser.add_argument("launch_args", nargs=argparse.REMAINDER, metavar="MLX_LAUNCH_ARGS",
                        help="mlx.launch's own options (-n, --hostfile, --backend, ...), then -- and the "
                             "command each rank runs, e.g. -n 2 -- mlx-grpo train --config FILE; --check "
                             "asks every host for its versions, hashes, backend and memory and launches "
                             "nothing (a launch does it first; --no-check skips it)")


def main(args) -> int:
    rest = args.launch_args[1:] if args.launch_args[:1] == ["--"] else args.launch_args
    return launch(rest)
