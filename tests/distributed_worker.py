"""One GRPO update from fixed completions, for the data-parallel equivalence test.

Run as a rank (`python tests/distributed_worker.py OUT_DIR`, with the ring backend's
MLX_RANK and MLX_HOSTFILE set), it trains on its share of each case's prompts and writes
the updated trainable weights and the update's metrics to OUT_DIR. The test calls
`one_update` in its own process with the whole batch and compares.
`python tests/distributed_worker.py lock OUT_DIR` trains one step instead and records, from
inside each rank's reward, who holds the run folder's lock (`lock_run`).

The optimizer is plain SGD without clipping: AdamW's first step is lr * sign(grad), which
would hide a gradient that is off by a constant factor (a wrong normaliser).
"""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten

from mlx_grpo.config import load_config
from mlx_grpo.distributed import SINGLE, init_world, local_share, sync_parameters
from mlx_grpo.models.load import load_base
from mlx_grpo.rollout.sample import Rollout
from mlx_grpo.rng import seed_everything
from mlx_grpo.commands.setup import build_policy
from mlx_grpo.update import step
from mlx_grpo.update.step import optimize

G = 4
BASE = ["model.path=\"builtin:tiny\"", f"generation.num_generations={G}", "generation.max_new_tokens=16",
        "training.max_grad_norm=0", "grpo.beta=0.04", "seed=3"]
# Each case: name -> overrides. Completion lengths differ a lot between prompts, so a
# per-rank token count instead of the global one would change bnpo and dapo.
CASES = {
    "grpo": ["grpo.loss_type=\"grpo\""],
    "bnpo": ["grpo.loss_type=\"bnpo\""],
    "dr_grpo": ["grpo.loss_type=\"dr_grpo\""],
    "dapo": ["grpo.loss_type=\"dapo\""],
    "dapo_accum_batch_scale": [  # 2 parts of 2 prompts, chunks of 3 rows, batch-std advantages
        "grpo.loss_type=\"dapo\"", "training.gradient_accumulation_steps=2", "training.micro_batch_size=3",
        "grpo.scale_rewards=\"batch\"", "grpo.mask_truncated_completions=true",
    ],
    "bnpo_lora": ["grpo.loss_type=\"bnpo\"", "lora.enabled=true", "lora.rank=4"],
    # the gradients summed across ranks in bfloat16: equal within bfloat16's rounding
    "dapo_bf16_reduce": ["grpo.loss_type=\"dapo\"", "distributed.reduce_dtype=\"bfloat16\""],
    # the all-reduce evaluated with the last micro-batch's backward pass (update/step.py, on Metal)
    "dapo_accum_overlap": ["grpo.loss_type=\"dapo\"", "training.gradient_accumulation_steps=2",
                           "training.micro_batch_size=3"],
}


def case_config(name):
    return load_config(None, BASE + CASES[name])


def fixed_rollout(cfg, vocab_size: int):
    """prompts_per_step * accumulation prompts with G completions each, and their rewards."""
    t = cfg.training
    num_prompts = t.prompts_per_step * t.gradient_accumulation_steps
    rng = random.Random(7)
    rows = []
    for p in range(num_prompts):
        prompt = [rng.randrange(1, vocab_size) for _ in range(5 + 3 * p)]
        for j in range(G):
            cap = cfg.generation.max_new_tokens
            length = min(2 + j + 5 * (p % 2) * (j + 1), cap)  # odd prompts: long completions
            completion = [rng.randrange(1, vocab_size) for _ in range(length)]
            rows.append((p, prompt, completion, length == cap, ((j + 1) * (p + 1) % 5) / 4))
    return rows


def one_update(name: str, world=SINGLE):
    """The updated trainable weights and metrics after one update on this rank's rows."""
    cfg = case_config(name)
    seed_everything(cfg.seed)
    model, _, base_path, _ = build_policy(cfg)
    sync_parameters(model, world)
    ref_model = None
    if not cfg.lora.enabled:
        ref_model = load_base(cfg.model, base_path)[0]
        ref_model.freeze()
    rows = fixed_rollout(cfg, model.args.vocab_size)
    mine = set(local_share(sorted({r[0] for r in rows}), cfg.training.prompts_per_step, world))
    rows = [r for r in rows if r[0] in mine]
    rollout = Rollout([r[1] for r in rows], [r[2] for r in rows], [""] * len(rows), [r[3] for r in rows], G)
    optimizer = optim.SGD(learning_rate=1.0)
    overlap, step.OVERLAP_ALLREDUCE = step.OVERLAP_ALLREDUCE, name.endswith("_overlap")
    try:
        metrics = optimize(model, optimizer, ref_model, rollout, [r[4] for r in rows], cfg, world)
    finally:
        step.OVERLAP_ALLREDUCE = overlap
    return dict(tree_flatten(model.trainable_parameters())), metrics


PROBE = """\
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
holder = os.read(fd, 100).split()[0].decode()
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("free", holder)
except OSError:
    print("held", holder)
"""


def lock_run(out_dir: str):
    """One GRPO step of builtin:tiny on both ranks, in one run folder; while it trains, this rank's
    reward notes its PID, the PID the lock file names and whether the lock is free."""
    import mlx_grpo

    run, seen = Path(out_dir) / "run", {}

    def lock_probe(prompts, completions, answers, **kwargs):
        if not seen:
            # Asked from another process: a record lock never conflicts with its own process, and
            # closing a descriptor of the file here (reading it) would release rank 0's lock.
            probe = subprocess.run([sys.executable, "-c", PROBE, str(run / ".lock")], capture_output=True, text=True)
            state, holder = probe.stdout.split()
            seen.update(pid=os.getpid(), holder=int(holder), free=state == "free")
        return [0.0] * len(completions)

    mlx_grpo.train("configs/smoke_test.toml", rewards=[lock_probe], output_dir=str(run),
                   training={"max_steps": 1, "prompts_per_step": 2}, generation={"max_new_tokens": 8},
                   logging={"log_completions": 0})
    (Path(out_dir) / f"lock_rank{os.environ['MLX_RANK']}.json").write_text(json.dumps(seen))


def main(out_dir: str):
    world = init_world()
    out = Path(out_dir)
    for name in CASES:
        weights, metrics = one_update(name, world)
        mx.save_safetensors(str(out / f"{name}_rank{world.rank}.safetensors"), weights)
        (out / f"{name}_rank{world.rank}.json").write_text(json.dumps(metrics))


if __name__ == "__main__":
    lock_run(sys.argv[2]) if sys.argv[1] == "lock" else main(sys.argv[1])
