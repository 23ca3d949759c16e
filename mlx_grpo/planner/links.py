"""Step time and scaling efficiency of a data-parallel run over N Macs joined by a link, for
`mlx-grpo plan --ranks N --link NAME`. Pure Python.

A step on N Macs takes the one-Mac step time over N (sampling and the forward and backward passes
split evenly: every rank holds 1/N of the prompts), plus, for each optimizer update, one ring
all-reduce of the trainable parameters:

    allreduce(N, bytes) = 2 (N - 1) * latency + 2 (N - 1) / N * bytes / (RING_EFFICIENCY * bandwidth)

A ring all-reduce is a reduce-scatter and an all-gather, N - 1 exchanges each, in which every
rank sends and receives 1/N of the bytes. `latency` and `bandwidth` are a link's own, taken from
the sources LINKS names (one direction, TCP, which the ring backend uses). RING_EFFICIENCY and
the fit were measured on this project's CI machine (scripts/link_scaling.py): 2 to 4 ranks in
network namespaces joined by veth pairs whose bandwidth `tc tbf` limits, for gradients of
builtin:small and Qwen2.5-0.5B's shapes, full and LoRA; docs/benchmarks.md's link table says which of
its rows were measured there and which are predicted here.
"""

from dataclasses import dataclass

# Measured (scripts/link_scaling.py, docs/benchmarks.md, "The all-reduce over emulated links"): the bandwidth a fit of
# the ring's all-reduce times at 2-4 ranks gives, over the bandwidth tbf allowed: 0.76 at 36 MB/s,
# 0.73 at 25 MB/s, 0.66 at 100 MB/s (2-core CI machine at load 7-12; a quiet machine may do better).
RING_EFFICIENCY = 0.7


@dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes per second, one direction, as TCP carries it
    latency: float  # seconds per ring exchange (one message between neighbours)
    source: str


LINKS = {
    "tb5": Link(5.0e9, 300e-6, "Thunderbolt 5 bridge: 80 Gb/s signalling, of which TCP gets about half "
                               "(swellweb/targetBridge#17); ~300 us per TCP exchange over Thunderbolt "
                               "(Apple TN3205 coverage; exo-explore/exo#2295 measured 0.38-0.95 ms RTT)"),
    "tb4": Link(2.05e9, 300e-6, "Thunderbolt 4 bridge: iperf3 16.4 Gb/s TCP Mac to PC over a USB4 20/20 "
                                "link (jiribrejcha.net); ~300 us per TCP exchange as for tb5"),
    "10gbe": Link(1.17e9, 300e-6, "10 Gigabit Ethernet: 9.4 Gb/s TCP, the line rate less TCP/IP headers (as "
                                  "941 Mb/s on 1 GbE, esnet/iperf#1170); ~300 us per TCP exchange"),
    "wifi": Link(36e6, 3.75e-3, "Wi-Fi 6 between two wireless Macs: ~580 Mb/s TCP through one access point "
                                "(aletheatech.com, Wi-Fi 6 AP), halved for wireless to wireless "
                                "(thornelabs.net); 7.5 ms RTT, the best average exo-explore/exo#2295 "
                                "measured over Wi-Fi, halved"),
}


def allreduce_seconds(ranks: int, nbytes: float, link: Link) -> float:
    """One ring all-reduce of `nbytes` over `ranks` Macs (0 for one Mac)."""
    if ranks <= 1:
        return 0.0
    exchanges = 2 * (ranks - 1)
    return exchanges * link.latency + exchanges / ranks * nbytes / (RING_EFFICIENCY * link.bandwidth)


def scaling(step_seconds: float, nbytes: float, updates: int, link: Link, ranks: int) -> dict:
    """Predicted seconds per step on `ranks` Macs, from the one-Mac step time, and the scaling
    efficiency: the one-Mac step over ranks x that step (1 = perfect)."""
    step = step_seconds / ranks + updates * allreduce_seconds(ranks, nbytes, link)
    return {"ranks": ranks, "step_seconds": step, "allreduce_seconds": allreduce_seconds(ranks, nbytes, link),
            "speedup": step_seconds / step, "efficiency": step_seconds / (ranks * step)}


def format_scaling(step_seconds: float, nbytes: float, updates: int, link_name: str, most: int) -> list[str]:
    """`mlx-grpo plan --ranks`'s lines: the predicted step on 1 to `most` Macs over the link."""
    link = LINKS[link_name]
    lines = [f"scaling over {link_name} ({link.bandwidth / 1e9:.3g} GB/s, {link.latency * 1e3:.3g} ms per exchange: "
             f"{link.source}):",
             f"  {nbytes / 1e6:.2f} MB all-reduced per update, {updates} update(s) per step, from a one-Mac step "
             f"of {step_seconds:.2f} s split evenly over the Macs",
             f"  {'Macs':>4} {'step s':>10} {'all-reduce s':>13} {'speedup':>8} {'efficiency':>10}"]
    for n in range(1, most + 1):
        row = scaling(step_seconds, nbytes, updates, link, n)
        lines.append(f"  {n:>4} {row['step_seconds']:>10.3f} {row['allreduce_seconds']:>13.4f} "
                     f"{row['speedup']:>8.2f} {row['efficiency']:>10.2f}")
    return lines
