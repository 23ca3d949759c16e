"""The scaling model (issue 33, item 4): the ring all-reduce's arithmetic and `mlx-grpo plan --ranks N
--link NAME`; the gradient buckets (item 5); and the emulated links themselves: two ranks in network
namespaces joined by veth pairs that `tc tbf` limits, as scripts/link_scaling.py measures them.
The namespace test needs root and `ip` (CI runs as root; a developer's Mac has no `ip`)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_grpo.allreduce import buckets
from mlx_grpo.cli import main
from mlx_grpo.planner.links import LINKS, RING_EFFICIENCY, Link, allreduce_seconds, scaling

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import link_scaling  # noqa: E402

sys.path.pop(0)


def test_ring_allreduce_time_is_latency_per_exchange_plus_its_share_of_the_bytes():
    link = Link(bandwidth=100e6, latency=1e-3, source="")
    assert allreduce_seconds(1, 4e8, link) == 0.0  # one Mac: nothing to reduce
    # 4 Macs: 2 * 3 = 6 exchanges of 1 ms, each rank sending 6 / 4 of 100 MB at RING_EFFICIENCY (0.7) x 100 MB/s
    assert allreduce_seconds(4, 100e6, link) == pytest.approx(6e-3 + 1.5 * 100e6 / (RING_EFFICIENCY * 100e6))
    row = scaling(20.0, 100e6, 2, link, 4)
    step = 20.0 / 4 + 2 * allreduce_seconds(4, 100e6, link)
    assert row["step_seconds"] == pytest.approx(step)
    assert row["efficiency"] == pytest.approx(20.0 / (4 * step)) and row["speedup"] == pytest.approx(20.0 / step)


def test_plan_prints_the_step_and_efficiency_on_1_to_n_macs(capsys):
    assert main(["plan", "--config", "configs/smoke_test.toml", "--ranks", "3", "--link", "tb4",
                 "--step-seconds", "12"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(out) if line.startswith("scaling over tb4 (2.05 GB/s, 0.3 ms"))
    rows = [line.split() for line in out[head + 3:]]
    assert [r[0] for r in rows] == ["1", "2", "3"]
    nbytes = float(out[head + 1].split()[0]) * 1e6  # "3.32 MB all-reduced per update": builtin:tiny's float32
    for n, step, _, speedup, efficiency in rows:
        want = scaling(12.0, nbytes, 1, LINKS["tb4"], int(n))
        assert float(step) == pytest.approx(want["step_seconds"], abs=1e-3)
        assert float(efficiency) == pytest.approx(want["efficiency"], abs=0.01)


def test_plan_ranks_without_link_or_step_is_one_line(capsys):
    assert main(["plan", "--config", "configs/smoke_test.toml", "--ranks", "4", "--link", "wifi"]) == 2
    assert capsys.readouterr().err.strip() == (
        "mlx-grpo: error: --ranks needs --link (one of tb5, tb4, 10gbe, wifi) and --step-seconds S > 0, the "
        "one-Mac step time (metrics.jsonl's step_time, or `mlx-grpo bench`)")


def test_buckets_hold_the_last_arrays_first_and_close_at_the_size():
    # 4-byte items: arrays of 40, 80, 120 and 160 bytes; a bucket closes at 100 bytes or more
    assert buckets([10, 20, 30, 40], 4, 100) == [[3], [2], [1, 0]]
    assert buckets([10, 20, 30, 40], 4, 10**9) == [[3, 2, 1, 0]]
    assert buckets([], 4) == []


ROOT_AND_IP = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def _ours(prefix: str) -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    return [n for n in names if n.startswith(prefix)]


@pytest.mark.skipif(not ROOT_AND_IP, reason="network namespaces need root and the ip and tc commands")
def test_two_ranks_in_namespaces_all_reduce_no_faster_than_the_link_allows(tmp_path):
    rate = 4e6  # 4 MB/s each way
    with link_scaling.namespaces(2, rate) as (names, ips):
        assert all(ip.startswith("10.") for ip in ips) and len(_ours(names[0][:8])) == 3  # 2 ranks and the hub
        out = link_scaling.run_ranks(names, ips, ["scripts/link_scaling.py", "--worker", "--workloads",
                                                  "--repeats", "1", "--sweep", "4194304"], tmp_path, timeout=300)[0]
    assert _ours(names[0][:8]) == []  # every namespace (and the veths in them) deleted
    rows = {r["workload"]: r for r in map(json.loads, out.splitlines())}
    big = rows["flat-4194304"]
    # a 2-rank ring sends each rank's whole 4 MB once: at 4 MB/s at least about a second, however
    # fast this machine (the token bucket's 64 KB burst aside)
    assert big["bytes"] == 4194304 and big["seconds"] >= 0.9 * (4194304 - 65536) / rate
