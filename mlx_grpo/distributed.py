"""Data parallelism over `mx.distributed`: several processes (Macs) train one model.

Launched by `mlx.launch`, each process is a rank of a `World`. Every rank walks the same
global prompt stream and keeps its own share of each accumulation part, samples whole
groups locally (so group advantages need no communication), and computes gradients
that are averaged across ranks before one identical optimizer step everywhere. Rank 0
alone writes logs and checkpoints.

Why the average of the ranks' gradients is the one-process gradient: with W ranks each
holding 1/W of a part, a rank's loss is sum(own rows) / (normaliser / W), where the
normaliser is the one a single process would use for the whole part. grpo and dr_grpo
divide by a sequence count, which is the local count times W already; bnpo and dapo
divide by a token count, which each rank gets as the mean over ranks (`World.mean`).
Averaging then gives sum(all rows) / normaliser. The only traffic is that one gradient
all-reduce per update, plus a few scalars and the step's rewards and lengths.
"""

from contextlib import nullcontext
from dataclasses import dataclass
import json
import os
import re
import socket

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map
import numpy as np

from mlx_grpo.allreduce import DTYPES, mean_over_ranks
from mlx_grpo.deadline import INIT_S, Watch, init_deadline
from mlx_grpo.errors import TrainingError

# Set by `mlx-grpo launch` for its ranks: the launch command line that resumes the run, which
# rank 0 prints after a stop in place of its own `mlx-grpo train ... --resume`.
RESUME_ENV = "MLX_GRPO_RESUME"


@dataclass(frozen=True)
class World:
    """This process's place among the ranks; `group` is None for a single process."""

    rank: int = 0
    size: int = 1
    group: mx.distributed.Group | None = None
    watch: Watch | None = None  # the collectives' deadline (deadline.py)
    comm: mx.Stream | None = None  # the gradient all-reduce's stream (allreduce.py)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _watched(self, what: str):
        """Around a collective and its evaluation: past the deadline, every rank stops."""
        return self.watch.collective(what) if self.watch else nullcontext()

    def busy(self, what: str):
        """While this rank works alone (loading, evaluating, writing a checkpoint): the others
        wait for it without counting against the deadline."""
        return self.watch.busy(what) if self.watch else nullcontext()

    def at_step(self, step: int) -> None:
        if self.watch:
            self.watch.at_step(step)

    def step_done(self, seconds: float) -> None:
        """A step's time, which the deadline follows."""
        if self.watch:
            self.watch.step_done(seconds)

    def _sum(self, x: mx.array) -> mx.array:
        # Scalars and small vectors: on the CPU stream, as mlx-lm's trainer does.
        return mx.distributed.all_sum(x, group=self.group, stream=mx.cpu)

    def sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks."""
        if self.size == 1:
            return list(values)
        with self._watched("sum"):
            return self._sum(mx.array(values, dtype=mx.float32)).tolist()

    def mean(self, values: list[float]) -> list[float]:
        """Each value averaged over the ranks."""
        return [v / self.size for v in self.sum(values)]

    def max(self, value: float) -> float:
        if self.size == 1:
            return value
        with self._watched("max"):
            return mx.distributed.all_max(mx.array([value]), group=self.group, stream=mx.cpu).item()

    def gather(self, columns: dict[str, list[float]]) -> dict[str, list[float]]:
        """Every rank's rows of equal-length columns, rank 0's first (one all_gather)."""
        if self.size == 1:
            return {k: list(v) for k, v in columns.items()}
        table = mx.array(np.array(list(columns.values()), dtype=np.float32).T)  # (rows, C)
        with self._watched("gather"):
            out = np.array(mx.distributed.all_gather(table, group=self.group, stream=mx.cpu))  # (W rows, C)
        return dict(zip(columns, out.T.tolist()))

    def gather_ids(self, ids: list[int]) -> list[list[int]]:
        """Each rank's list of integer ids (every rank's of one length), rank 0's first. Sent as
        two float32 columns of 20 bits each, so ids below 2**40 arrive exactly."""
        if self.size == 1:
            return [list(ids)]
        cols = self.gather({"hi": [i >> 20 for i in ids], "lo": [i & 0xFFFFF for i in ids]})
        flat = [int(hi) << 20 | int(lo) for hi, lo in zip(cols["hi"], cols["lo"])]
        return [flat[r * len(ids):(r + 1) * len(ids)] for r in range(self.size)]

    def average_gradients(self, grads, dtype: str = "float32", pending=()):
        """The mean of every rank's gradients, summed in `dtype` (allreduce.py), evaluated with
        `pending` (what the gradients' last micro-batch left unevaluated) in one evaluation."""
        if self.size == 1:
            mx.eval(grads, pending)
            return grads
        with self._watched("gradient all-reduce"):
            grads, sums = mean_over_ranks(grads, self.group, dtype, self.comm)
            mx.eval(sums, pending)
            mx.eval(grads)
        return grads

    def broadcast(self, tree):
        """Rank 0's arrays on every rank: a sum where the other ranks add exact zeros."""
        if self.size == 1:
            return tree
        own = tree if self.is_main else tree_map(mx.zeros_like, tree)
        with self._watched("broadcast"):
            out = tree_map(lambda x: mx.distributed.all_sum(x, group=self.group), own)
            mx.eval(out)
        return out


SINGLE = World()


def init_world(timeout_s: float = 0.0) -> World:
    """The world `mlx.launch` started this process in, its collectives under a deadline
    (distributed.timeout_s; 0 = deadline.py's own); a single process otherwise."""
    rank = int(os.environ.get("MLX_RANK", "0") or 0)
    with init_deadline(max(timeout_s, INIT_S), rank, _ring_hosts() or "the backend's own addresses"):
        group = mx.distributed.init()
    if group.size() == 1:
        launched_rank = int(os.environ.get("MLX_RANK", "0") or 0)
        if launched_rank > 0:
            # Training alone here would write the same run folder as rank 0.
            raise TrainingError(
                f"MLX_RANK={launched_rank}: launched as a rank but mx.distributed found no "
                "other rank; check the host file and the backend (mlx.launch --verbose)"
            )
        return SINGLE
    return World(group.rank(), group.size(), group, _watch(group, timeout_s), mx.new_stream(mx.cpu))


def _ring_hosts() -> str:
    """The ring host file's addresses, rank 0's first ("" for another backend)."""
    try:
        with open(os.environ["MLX_HOSTFILE"]) as f:
            return ", ".join(node[0] for node in json.load(f))
    except (KeyError, OSError, ValueError, TypeError, IndexError):
        return ""


def _own_ip(rank: int) -> str:
    """The IPv4 address the other ranks reach this one at: the ring host file's, else the one that
    routes to the JACCL coordinator, else this host name's ("0.0.0.0" when there is none)."""
    try:
        if hosts := _ring_hosts():
            ip = hosts.split(", ")[rank].rsplit(":", 1)[0]
        elif coordinator := os.environ.get("MLX_JACCL_COORDINATOR", "").rsplit(":", 1)[0]:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((coordinator, 9))  # no packet is sent: this only picks the route
                ip = s.getsockname()[0]
        else:
            ip = socket.gethostbyname(socket.gethostname())
        socket.inet_aton(ip)
        return ip
    except (OSError, IndexError):  # not IPv4: no heartbeats reach this rank, the deadline still holds
        return "0.0.0.0"


def _watch(group, timeout_s: float) -> Watch:
    """Bind this rank's heartbeat socket and learn every rank's (one all_gather of IPs and ports)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", 0))
    ip = _own_ip(group.rank())
    mine = mx.array([*socket.inet_aton(ip), sock.getsockname()[1]], dtype=mx.int32)
    table = np.array(mx.distributed.all_gather(mine, group=group, stream=mx.cpu)).reshape(group.size(), 5)
    peers = [(socket.inet_ntoa(bytes(int(b) for b in row[:4])), int(row[4])) for row in table]
    return Watch(group.rank(), sock, peers, timeout_s)


def lost_rank(error: RuntimeError, world: World) -> TrainingError | None:
    """The one-line error for a collective that failed because another rank stopped (MLX's
    backends prefix theirs with the backend's name, e.g. "[ring] connection to a peer was
    lost"); None for any other error, which keeps its traceback."""
    if world.size == 1 or not re.match(r"\[\w+\] ", str(error)):
        return None
    return TrainingError(f"rank {world.rank}: {error}: another rank stopped first; its output says why")


def check_world(cfg, world: World) -> None:
    """What a data-parallel run needs of the config, checked before any work."""
    if world.size == 1:
        return
    pps = cfg.training.prompts_per_step
    if pps % world.size:
        raise TrainingError(
            f"training.prompts_per_step must divide by the number of ranks ({world.size}), "
            f"got {pps}; use a multiple of {world.size}"
        )
    if cfg.grpo.dynamic_sampling:
        raise TrainingError(
            f"grpo.dynamic_sampling is not supported across ranks ({world.size}): "
            "each rank would draw a different number of rounds; set it to false"
        )


def local_share(items: list, part_size: int, world: World) -> list:
    """This rank's items: its 1/W slice of every consecutive part of `part_size` items."""
    share = part_size // world.size
    out = []
    for start in range(0, len(items), part_size):
        lo = start + world.rank * share
        out.extend(items[lo:lo + share])
    return out


def sampling_seed(seed: int, rank: int, step: int = 0) -> int:
    """The seed of a rank's sampling stream: rank 0 keeps the run's seed, others a
    reproducible, well-spread derivation of (seed, rank), and of the step resumed from."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


def allreduce_bytes(model, dtype: str = "float32") -> int:
    """Bytes of the gradient all-reduce of one update: every trainable array once, in the reduce
    dtype (distributed.reduce_dtype; bfloat16 weights are summed in float32 unless it says otherwise)."""
    return sum(v.size for _, v in tree_flatten(model.trainable_parameters())) * DTYPES[dtype].size


def sync_parameters(model, world: World) -> None:
    """Give every rank rank 0's trainable weights (e.g. LoRA initialisation)."""
    if world.size == 1:
        return
    params = world.broadcast(model.trainable_parameters())
    mx.eval(params)
    model.update(params)
