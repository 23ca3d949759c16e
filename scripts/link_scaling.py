"""The all-reduce of a data-parallel update over emulated links: 2-4 ranks on this machine, each in a
network namespace of its own, joined through a bridge by veth pairs whose bandwidth `tc tbf`
limits in both directions (one port per Mac, as on a switch or one cable each way).

    sudo uv run python scripts/link_scaling.py --json links.json          # every rate and workload
    sudo uv run python scripts/link_scaling.py --rates wifi --ranks 2      # one row
    sudo uv run python scripts/link_scaling.py --overlap --rates wifi      # the update, overlap on/off

Each rank runs `allreduce.mean_over_ranks` (what a training update runs) on gradients shaped like
a workload's trainable parameters (builtin:small full and LoRA; Qwen2.5-0.5B's shapes with LoRA
rank 8, made lazily, no weights) and on flat arrays of a range of sizes, and times it (median of
--repeats, each after a barrier). The fit per rate, t = 2 (N - 1) latency + 2 (N - 1) / N * bytes
/ bandwidth, gives the ring's latency and bandwidth; bandwidth over the tbf rate is the ring's
efficiency, planner/links.py's RING_EFFICIENCY. netem is not in this kernel, so no latency is
added: a link's own latency comes from a published figure (planner/links.py), and this machine
cannot carry more than a few hundred MB/s, so only the slow links are emulated at their own rate.
Needs root and `ip`; only addresses inside the namespaces are used, and every namespace made is
deleted at the end, even after an error.
"""

import argparse
from contextlib import contextmanager
import json
import os
from pathlib import Path
import statistics
import subprocess
import sys
import time

ROOT = Path(__file__).resolve().parent.parent
RATES = {"wifi": 36e6, "25MBps": 25e6, "100MBps": 100e6, "unlimited": None}  # bytes per second
SWEEP = [2**k for k in (12, 16, 20, 22, 24, 26)]  # bytes of one flat float32 array
WORKLOADS = ("small-lora", "small-full", "qwen0.5b-lora")


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@contextmanager
def namespaces(ranks: int, rate: float | None):
    """`ranks` namespaces joined through a bridge, each link limited to `rate` bytes per second
    each way (None: the veth's own speed); yields (namespace names, their IPs). Deleted at the end."""
    tag = os.urandom(3).hex()
    hub, names, ips = f"mg{tag}h", [f"mg{tag}r{r}" for r in range(ranks)], []
    subnet = f"10.{200 + int(tag[:2], 16) % 50}.{int(tag[2:4], 16)}"
    made = []
    try:
        for ns in (hub, *names):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("link", "add", "br0", "type", "bridge", ns=hub)
        _ip("link", "set", "br0", "up", ns=hub)
        for r, ns in enumerate(names):
            inner, outer = f"mg{tag}v{r}", f"mg{tag}p{r}"
            _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "netns", hub)
            _ip("link", "set", outer, "master", "br0", ns=hub)
            for where, dev in ((hub, outer), (ns, inner)):
                _ip("link", "set", dev, "up", ns=where)
                if rate:  # a token bucket on each end: the rank's upload and its download
                    burst = max(int(rate / 100), 65536)
                    subprocess.run(["ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                                    "rate", f"{int(rate * 8)}bit", "burst", str(burst), "latency", "200ms"],
                                   check=True, capture_output=True)
            _ip("addr", "add", f"{subnet}.{r + 1}/24", "dev", inner, ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            ips.append(f"{subnet}.{r + 1}")
        yield names, ips
    finally:
        for ns in made:  # deleting a namespace deletes the veth ends inside it
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def run_ranks(names: list[str], ips: list[str], args: list[str], folder: Path, timeout: float = 900) -> list[str]:
    """Run `python ARGS` as rank r in namespace r over the ring backend; each rank's stdout."""
    hostfile = folder / f"ring-{names[0]}.json"
    hostfile.write_text(json.dumps([[f"{ip}:5000"] for ip in ips]))  # each namespace has its own ports
    procs = [subprocess.Popen(["ip", "netns", "exec", ns, "env", f"MLX_RANK={r}", f"MLX_HOSTFILE={hostfile}",
                               sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r, ns in enumerate(names)]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        if p.returncode:
            raise RuntimeError(f"a rank failed ({p.returncode}): {err[-2000:]}")
    return [out for out, _ in outs]


def workload_grads(name: str):
    """Zero gradients shaped like the workload's trainable parameters."""
    import mlx.core as mx
    from mlx.utils import tree_map

    from mlx_grpo.commands.setup import build_policy
    from mlx_grpo.config import load_config

    lora = ["lora.enabled=true", "lora.rank=8"] if name.endswith("lora") else []
    if name.startswith("small"):
        model = build_policy(load_config(None, ['model.path="builtin:small"', *lora]))[0]
    else:
        from mlx_lm.models import qwen2
        from mlx_lm.tuner.utils import linear_to_lora_layers

        sys.path.insert(0, str(ROOT / "scripts"))
        from hub_memory_table import ARCHITECTURES, COMMON

        model = qwen2.Model(qwen2.ModelArgs.from_dict({**COMMON, **ARCHITECTURES["Qwen/Qwen2.5-0.5B-Instruct"]}))
        model.freeze()
        linear_to_lora_layers(model, 24, {"rank": 8, "scale": 2.0, "dropout": 0.0,
                                          "keys": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                   "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                   "mlp.down_proj"]})
    grads = tree_map(lambda p: mx.zeros(p.shape, mx.float32), model.trainable_parameters())
    mx.eval(grads)
    return grads


def worker(workloads: list[str], sweep: list[int], repeats: int, dtype: str) -> None:
    """One rank: time mean_over_ranks on each workload's gradients and each flat size; rank 0
    prints one JSON line per measurement."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlx_grpo.allreduce import DTYPES, mean_over_ranks

    group = mx.distributed.init()
    comm = mx.new_stream(mx.cpu)
    trees = [(w, workload_grads(w)) for w in workloads] + [(f"flat-{n}", {"x": mx.zeros(n // 4)}) for n in sweep]
    for name, tree in trees:
        nbytes = sum(v.size for _, v in tree_flatten(tree)) * DTYPES[dtype].size
        times = []
        for _ in range(repeats):
            mx.eval(mx.distributed.all_sum(mx.zeros(1), group=group, stream=mx.cpu))  # line the ranks up
            tic = time.perf_counter()
            mean, sums = mean_over_ranks(tree, group, dtype, comm)
            mx.eval(sums)
            mx.eval(mean)
            times.append(time.perf_counter() - tic)
        if group.rank() == 0:
            print(json.dumps({"workload": name, "bytes": nbytes, "seconds": statistics.median(times),
                              "runs": times}), flush=True)


def overlap_worker(repeats: int) -> None:
    """One rank: a real update of builtin:small (full fine-tune, 2 prompts x 4 completions of 64
    tokens on this rank, 2 micro-batches) with the all-reduce overlapping the last backward pass
    and without, alternately; rank 0 prints the medians as one JSON line."""
    import random

    import mlx.optimizers as optim

    from mlx_grpo.commands.setup import build_policy
    from mlx_grpo.config import load_config
    from mlx_grpo.distributed import init_world
    from mlx_grpo.rollout.sample import Rollout
    from mlx_grpo.update import step

    cfg = load_config(None, ['model.path="builtin:small"', "generation.num_generations=4", "training.micro_batch_size=4",
                             "generation.max_new_tokens=64", "training.max_grad_norm=0"])
    world = init_world()
    model = build_policy(cfg)[0]
    rng = random.Random(world.rank)
    vocab = model.args.vocab_size
    rows = [([rng.randrange(1, vocab) for _ in range(40)], [rng.randrange(1, vocab) for _ in range(64)])
            for _ in range(2) for _ in range(4)]
    rollout = Rollout([r[0] for r in rows], [r[1] for r in rows], [""] * 8, [False] * 8, 4)
    rewards = [rng.random() for _ in rows]
    optimizer, times = optim.SGD(learning_rate=1e-9), {True: [], False: []}
    grad_fn = step.make_update_grad_fn(model, cfg)
    for i in range(2 * repeats + 2):
        step.OVERLAP_ALLREDUCE = overlap = bool(i % 2)
        world.sum([0.0])  # line the ranks up
        tic = time.perf_counter()
        step.optimize(model, optimizer, None, rollout, rewards, cfg, world, grad_fn=grad_fn)
        if i >= 2:  # the first of each is tracing and compiling
            times[overlap].append(time.perf_counter() - tic)
    if world.is_main:
        print(json.dumps({"workload": "small-full update", "overlap_s": statistics.median(times[True]),
                          "sequential_s": statistics.median(times[False]), "runs": times}), flush=True)


def fit(rows: list[dict]) -> tuple[float, float]:
    """(latency s, bandwidth B/s) of t = 2 (N - 1) latency + 2 (N - 1) / N * bytes / bandwidth, by
    least squares of the relative error over `rows` (ranks, bytes, seconds): each row counts
    alike, a 4 KB all-reduce as much as a 100 MB one."""
    import numpy as np

    a = np.array([[2 * (r["ranks"] - 1), 2 * (r["ranks"] - 1) / r["ranks"] * r["bytes"]] for r in rows])
    t = np.array([r["seconds"] for r in rows])
    (latency, inverse), *_ = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)
    return float(latency), float(1 / inverse)


def measure(rate_names: list[str], ranks: list[int], workloads: list[str], repeats: int, dtype: str,
            folder: Path, sweep: list[int]) -> list[dict]:
    rows = []
    for rate_name in rate_names:
        for n in ranks:
            with namespaces(n, RATES[rate_name]) as (names, ips):
                args = ["scripts/link_scaling.py", "--worker", "--workloads", *workloads, "--repeats", str(repeats),
                        "--dtype", dtype, "--sweep", *map(str, sweep)]
                out = run_ranks(names, ips, args, folder)[0]
            for line in out.splitlines():
                row = {"link": rate_name, "rate": RATES[rate_name], "ranks": n, **json.loads(line)}
                print(f"{rate_name:>9} N={n} {row['workload']:>15} {row['bytes'] / 1e6:10.3f} MB "
                      f"{row['seconds']:9.4f} s", flush=True)
                rows.append(row)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", nargs="+", default=list(RATES), choices=list(RATES))
    p.add_argument("--ranks", nargs="+", type=int, default=[2, 3, 4])
    p.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sweep", nargs="*", type=int, default=SWEEP, help="sizes in bytes of the flat arrays timed too")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--json", default=None, help="write every measurement and the fits here")
    p.add_argument("--overlap", action="store_true",
                   help="time a real update of builtin:small with the all-reduce overlapping the backward and not")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        overlap_worker(args.repeats) if args.overlap else worker(args.workloads, args.sweep, args.repeats, args.dtype)
        return
    folder = Path(os.environ.get("TMPDIR", "/tmp"))
    if args.overlap:
        for rate_name in args.rates:
            with namespaces(2, RATES[rate_name]) as (names, ips):
                out = run_ranks(names, ips, ["scripts/link_scaling.py", "--worker", "--overlap", "--repeats",
                                             str(args.repeats)], folder)[0]
            print(rate_name, out.strip(), flush=True)
        return
    rows = measure(args.rates, args.ranks, args.workloads, args.repeats, args.dtype, folder, args.sweep)
    fits = {}
    for rate_name in args.rates:
        latency, bandwidth = fit([r for r in rows if r["link"] == rate_name])
        rate = RATES[rate_name]
        fits[rate_name] = {"latency": latency, "bandwidth": bandwidth, "efficiency": bandwidth / rate if rate else None}
        print(f"fit {rate_name}: latency {latency * 1e3:.3f} ms, bandwidth {bandwidth / 1e6:.1f} MB/s"
              + (f", {bandwidth / rate:.2f} of the tbf rate" if rate else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "fits": fits}, indent=1) + "\n")


if __name__ == "__main__":
    main()
