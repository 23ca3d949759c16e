"""Data-parallel training: rank slicing, seeds and errors, the 2-rank == 1-rank update
(two real processes on localhost over the ring backend), and a launched smoke run."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_grpo.config import load_config
from mlx_grpo.distributed import (
    SINGLE, World, allreduce_bytes, check_world, init_world, local_share, sampling_seed,
)
from mlx_grpo.errors import TrainingError
from mlx_grpo.run.log import read_metrics
from mlx_grpo.commands.setup import build_policy

import distributed_worker

ROOT = Path(__file__).resolve().parent.parent


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _spawn_ranks(args: list[str], tmp_path, n: int = 2, timeout: float = 300):
    """Start n ranks of `python ARGS` with the ring backend's environment; wait for all."""
    hostfile = tmp_path / "ring.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in _free_ports(n)]))
    procs = [
        subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "MLX_RANK": str(r), "MLX_HOSTFILE": str(hostfile)},
        )
        for r in range(n)
    ]
    try:
        return [(p.wait(timeout), *p.communicate()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_local_share_takes_each_ranks_slice_of_every_part():
    items = list(range(12))  # 3 accumulation parts of 4 prompts
    assert local_share(items, 4, World(0, 2)) == [0, 1, 4, 5, 8, 9]
    assert local_share(items, 4, World(1, 2)) == [2, 3, 6, 7, 10, 11]
    assert local_share(items, 4, SINGLE) == items


def test_sampling_seed_differs_per_rank_and_repeats():
    assert sampling_seed(5, 0) == 5  # rank 0 samples as a single process would
    seeds = [sampling_seed(5, r) for r in range(4)]
    assert len(set(seeds)) == 4
    assert seeds == [sampling_seed(5, r) for r in range(4)]
    assert sampling_seed(6, 1) != seeds[1]


def test_check_world_errors_name_the_key():
    cfg = load_config(None, ["training.prompts_per_step=3"])
    expected = r"training.prompts_per_step must divide by the number of ranks \(2\), got 3"
    with pytest.raises(TrainingError, match=expected):
        check_world(cfg, World(0, 2))
    check_world(cfg, World(0, 3))
    check_world(cfg, SINGLE)
    cfg = load_config(None, ["training.prompts_per_step=2", "grpo.dynamic_sampling=true"])
    with pytest.raises(TrainingError, match="grpo.dynamic_sampling"):
        check_world(cfg, World(1, 2))


def test_single_process_world_is_identity():
    world = init_world()
    assert (world.rank, world.size) == (0, 1)
    assert world.mean([3.0, 4.5]) == [3.0, 4.5]
    assert world.gather({"a": [1.0, 2.0]}) == {"a": [1.0, 2.0]}


class _TwoRanksAlike(World):
    """World(0, 2) whose gather returns rank 0's columns followed by a second rank's copy + 1."""

    def gather(self, columns):
        return {k: list(v) + [x + 1.0 for x in v] for k, v in columns.items()}


def test_gather_ids_are_exact_past_float32s_24_bits():
    ids = [0, 7, 2**24 + 1, 2**39 + 12345]  # float32 alone holds integers exactly only below 2**24
    # each id split as hi = id >> 20, lo = id & (2**20 - 1); the copy adds 1 to both: id + 2**20 + 1
    assert _TwoRanksAlike(0, 2).gather_ids(ids) == [ids, [i + 2**20 + 1 for i in ids]]
    assert SINGLE.gather_ids(ids) == [ids]


def test_rank_without_a_group_refuses_to_train_alone(monkeypatch):
    init_world()  # the single-process group, created once per process
    monkeypatch.setenv("MLX_RANK", "1")
    with pytest.raises(TrainingError, match="MLX_RANK=1: launched as a rank but mx.distributed found no other rank"):
        init_world()


def test_allreduce_bytes_full_vs_lora():
    full, *_ = build_policy(load_config(None, []))
    assert allreduce_bytes(full) == 4 * sum(v.size for _, v in tree_flatten(full.parameters()))
    lora, *_ = build_policy(load_config(None, ["lora.enabled=true", "lora.rank=8"]))
    # LoRA on a d_in -> d_out linear trains A (d_in x r) and B (r x d_out): r (d_in + d_out) floats.
    targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    expected = 0
    for name, module in full.named_modules():
        if name.split(".")[-1] in targets:
            d_out, d_in = module.weight.shape
            expected += 4 * 8 * (d_in + d_out)
    assert allreduce_bytes(lora) == expected
    assert allreduce_bytes(lora) < allreduce_bytes(full) / 4


def test_two_ranks_one_prompt_each_equal_one_rank_two_prompts(tmp_path):
    results = _spawn_ranks(["tests/distributed_worker.py", str(tmp_path)], tmp_path)
    for rc, out, err in results:
        assert rc == 0, err[-2000:]
    for name in distributed_worker.CASES:
        single, single_metrics = distributed_worker.one_update(name)
        ranks = [mx.load(str(tmp_path / f"{name}_rank{r}.safetensors")) for r in range(2)]
        for key, want in single.items():
            assert mx.array_equal(ranks[0][key], ranks[1][key]).item(), (name, key)  # one identical step
        start, *_ = build_policy(distributed_worker.case_config(name))
        start = dict(tree_flatten(start.trainable_parameters()))
        delta = lambda w: np.concatenate([np.array(w[k] - start[k]).ravel() for k in sorted(single)])
        want, got = delta(single), delta(ranks[0])
        assert np.abs(want).max() > 1e-4, name  # the update moved the weights
        error = np.abs(got - want).max() / np.abs(want).max()
        if name.endswith("bf16_reduce"):
            # bfloat16 keeps 8 significant bits: each rank's gradient and their sum are rounded to
            # within 2**-9 of themselves, and where the ranks' gradients partly cancel, a rank's
            # entry is several times the mean's: measured 0.0053 of the largest entry (0.0033 in
            # norm). float32's error is 1e-7, so more than 1e-4 shows the bfloat16 path ran.
            assert 1e-4 < error <= 2**-6, (name, error)
        else:
            assert error <= 1e-4, (name, error)
        dist_metrics = json.loads((tmp_path / f"{name}_rank0.json").read_text())
        for key in ("loss", "grad_norm", "clip_ratio/region_mean"):
            assert dist_metrics[key] == pytest.approx(single_metrics[key], rel=1e-4, abs=1e-7), (name, key)


def test_only_rank_0_holds_the_run_folder_lock(tmp_path):
    results = _spawn_ranks(["tests/distributed_worker.py", "lock", str(tmp_path)], tmp_path)
    for rc, out, err in results:
        assert rc == 0, err[-2000:]  # a second rank taking the lock would have been refused
    seen = [json.loads((tmp_path / f"lock_rank{r}.json").read_text()) for r in range(2)]
    assert seen[0]["pid"] != seen[1]["pid"]
    assert seen[0]["holder"] == seen[1]["holder"] == seen[0]["pid"]  # rank 0's PID, seen by both
    assert not seen[0]["free"] and not seen[1]["free"]  # held while the ranks train
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1]  # one log, written by rank 0


@pytest.mark.slow  # two CLI start-ups: ~20 s here; check_world's message is tested above
def test_launched_rank_with_indivisible_prompts_stops_with_one_line(tmp_path):
    args = ["-m", "mlx_grpo", "train", "--config", "configs/smoke_test.toml",
            "--set", "training.prompts_per_step=3", "--set", f'output_dir="{tmp_path / "run"}"']
    for rc, out, err in _spawn_ranks(args, tmp_path):
        assert rc == 2
        assert err.strip().splitlines()[-1] == (
            "mlx-grpo: error: training.prompts_per_step must divide by the number of ranks (2), "
            "got 3; use a multiple of 2"
        )
    assert not (tmp_path / "run").exists()


def _launch_port() -> int:
    """A port p with p and p + 1 free (mlx.launch gives rank r port p + r)."""
    for _ in range(50):
        p = int(np.random.default_rng().integers(20000, 60000))
        try:
            for q in (p, p + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
    raise RuntimeError("no free port pair")


def _launch(run, *sets):
    cmd = [sys.executable, "-m", "mlx_grpo", "launch", "-n", "2", "-p", str(_launch_port()), "--",
           sys.executable, "-m", "mlx_grpo",
           "train", "--config", "configs/smoke_test.toml", "--set", "training.prompts_per_step=2",
           "--set", "generation.max_new_tokens=24", "--set", "checkpoint.save_every=10",
           "--set", f'output_dir="{run}"', *sets]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]  # mlx-grpo launch fails when a rank fails
    return proc


@pytest.mark.slow  # ~100 s here
def test_mlx_launch_two_processes_write_one_log_and_checkpoint_and_resume(tmp_path):
    run = tmp_path / "run"
    proc = _launch(run, "--set", "training.max_steps=2")
    assert proc.stdout.count("data-parallel over 2 ranks") == 1
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["reward"]) for r in rows)
    (ckpt,) = (run / "checkpoints").iterdir()
    assert ckpt.name == "step_000002"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert (state["step"], state["data_position"]) == (2, 4)  # the one global stream: 2 steps x 2 prompts
    written = sorted(p.name for p in run.iterdir())
    assert written == [".lock", "checkpoints", "completions.jsonl", "config.toml", "metrics.jsonl"]  # rank 0 alone

    proc = _launch(run, "--set", "training.max_steps=3", "--resume")
    assert proc.stdout.count("resumed from") == 1
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    state = json.loads((run / "checkpoints" / "step_000003" / "trainer_state.json").read_text())
    assert (state["step"], state["data_position"]) == (3, 6)


def test_launched_ranks_print_step_lines_with_no_bar_glued_to_them(tmp_path):
    # The ranks' stdout and stderr are pipes to the launcher: no rank draws a bar there, so the
    # two streams, merged as on the user's terminal, hold whole step lines and no redraws.
    sets = ["training.max_steps=2", "training.prompts_per_step=2", "generation.num_generations=4",
            "generation.max_new_tokens=16", "checkpoint.save_every=10", f'output_dir="{tmp_path / "run"}"']
    cmd = [sys.executable, "-m", "mlx_grpo", "launch", "-n", "2", "-p", str(_launch_port()), "--",
           sys.executable, "-m", "mlx_grpo", "train", "--config", "configs/smoke_test.toml",
           *[x for s in sets for x in ("--set", s)]]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "\r" not in proc.stdout and not re.search(r"^grpo: |%\|", proc.stdout, re.M), proc.stdout
    steps = [line.split(" | ")[0] for line in proc.stdout.splitlines() if " | loss " in line]
    assert steps == ["step 1", "step 2"], proc.stdout  # each starts its line, printed by rank 0 alone


def test_launch_fails_with_one_line_when_a_rank_fails(tmp_path):
    # rank 0 refuses an output_dir that holds a run; rank 1, waiting on it, loses its peer
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 1.0}\n')
    cmd = [sys.executable, "-m", "mlx_grpo", "launch", "-n", "2", "-p", str(_launch_port()), "--",
           sys.executable, "-m", "mlx_grpo", "train", "--config", "configs/smoke_test.toml",
           "--set", f'output_dir="{run}"']
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "[WARN]" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mlx-grpo: error:")]
    assert errors[0].startswith(f"mlx-grpo: error: output_dir: {run} already holds a run"), errors
    # the launcher stops the other rank when it sees one end, so either may count as stopped
    assert re.fullmatch(r"mlx-grpo: error: the launch failed: rank 0 (exited with code 2|was stopped), "
                        r"rank 1 (exited with code 2|was stopped); each rank's own line above says why",
                        errors[-1]), errors
    assert "exited with code 2" in errors[-1]
    # rank 1 says in one line why it stopped, when it got that far before being stopped
    assert all(e.startswith("mlx-grpo: error: rank 1: [ring] ") for e in errors[1:-1]), errors


def test_launch_of_ranks_that_succeed_exits_0(tmp_path):
    cmd = [sys.executable, "-m", "mlx_grpo", "launch", "-n", "2", "-p", str(_launch_port()), "--",
           sys.executable, "-c", "import mlx.core as mx; g = mx.distributed.init(); "
           "print(g.rank(), g.size(), mx.distributed.all_sum(mx.ones(1)).item())"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["0 2 2.0", "1 2 2.0"]
