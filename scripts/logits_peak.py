"""The peak of one GRPO update on a Qwen2.5-0.5B-shaped model, where the completion logits matter.

    uv run python scripts/logits_peak.py                      # chunked logits (the default budget)
    uv run python scripts/logits_peak.py --budget 0           # one chunk: the logits as before chunking
    uv run python scripts/logits_peak.py --planner            # and what the memory planner predicts

Random float32 weights of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads,
intermediate 4864, vocabulary 151,936, tied embeddings), LoRA r16 on every linear layer of every
block, P = 2 prompts x G = 8 fixed random completions of 256 tokens on 100-token prompts, the
defaults otherwise (shared prefixes, beta 0, one micro-batch of all 16 rows). Prints the update's
peak above the weights (MLX's counters), its seconds, and the logits' budget used. Several GB:
run it alone.
"""

import argparse
import json
import time

import mlx.core as mx
import numpy as np

QWEN25_05B = dict(
    model_type="qwen2", hidden_size=896, num_hidden_layers=24, intermediate_size=4864,
    num_attention_heads=14, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=151_936,
    tie_word_embeddings=True, rope_theta=1_000_000.0, max_position_embeddings=32_768,
)
PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 2, 100, 256


def build(cfg):
    """The random model with its adapters (the base frozen, as `build_policy` leaves it)."""
    from mlx_lm.models import qwen2

    from mlx_grpo.models.load import add_adapters, checkpoint_layers

    mx.random.seed(0)
    model = qwen2.Model(qwen2.ModelArgs(**QWEN25_05B))
    mx.eval(model.parameters())
    add_adapters(model, cfg.lora)
    if cfg.training.grad_checkpoint:
        checkpoint_layers(model)
    mx.eval(model.parameters())
    return model


def rollout(G: int):
    from mlx_grpo.rollout.sample import Rollout

    rng = np.random.default_rng(0)
    vocab = QWEN25_05B["vocab_size"]
    prompts = [rng.integers(3, vocab, PROMPT_TOKENS).tolist() for _ in range(PROMPTS)]
    rows = PROMPTS * G
    return Rollout(
        prompt_tokens=[prompts[i // G] for i in range(rows)],
        completion_tokens=[rng.integers(3, vocab, NEW_TOKENS).tolist() for _ in range(rows)],
        texts=[""] * rows, truncated=[False] * rows, group_size=G,
    ), np.linspace(0.0, 1.0, rows).tolist()


def planner(model, cfg) -> dict:
    """The planner's phases (GB) for this model and run, from the parameters' shapes."""
    from mlx.utils import tree_flatten

    from mlx_grpo.planner.predict import predict
    from mlx_grpo.planner.shapes import ModelShape, Tensor, run_shape

    a = QWEN25_05B
    base = {k: v for k, v in tree_flatten(model.parameters()) if "lora_" not in k}
    shape = ModelShape(
        layers=a["num_hidden_layers"], hidden=a["hidden_size"], heads=a["num_attention_heads"],
        kv_heads=a["num_key_value_heads"], head_dim=a["hidden_size"] // a["num_attention_heads"],
        vocab=a["vocab_size"], tensors={k.replace(".linear.", "."): Tensor("F32", tuple(v.shape)) for k, v in base.items()},
    )
    return {k: round(v / 1e9, 2) for k, v in predict(shape, run_shape(cfg)).items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=None,
                        help="logit elements a chunk holds (algorithm/chunked.py); 0 = one chunk")
    parser.add_argument("--planner", action="store_true", help="print the memory planner's prediction too")
    parser.add_argument("--generations", type=int, default=8, help="G, completions per prompt")
    parser.add_argument("--grad-checkpoint", action="store_true", help="training.grad_checkpoint = true")
    args = parser.parse_args(argv)
    from mlx_grpo.config import load_config
    from mlx_grpo.update.optimizer import make_optimizer
    from mlx_grpo.update.step import optimize

    try:
        from mlx_grpo.algorithm import chunked
    except ImportError:  # a checkout from before chunking: its logits are one chunk
        chunked = None
    if chunked is not None and args.budget is not None:
        chunked.LOGITS_BUDGET = args.budget or 1 << 62
    G = args.generations
    cfg = load_config(None, ["lora.enabled=true", "lora.rank=16", f"generation.num_generations={G}",
                             f"training.prompts_per_step={PROMPTS}", f"generation.max_new_tokens={NEW_TOKENS}",
                             f"data.max_prompt_tokens={PROMPT_TOKENS}", f"training.grad_checkpoint={str(args.grad_checkpoint).lower()}"])
    model = build(cfg)
    (completions, rewards), optimizer = rollout(G), make_optimizer(cfg.training, 10)
    weights = mx.get_active_memory()
    mx.reset_peak_memory()
    tic = time.perf_counter()
    metrics = optimize(model, optimizer, None, completions, rewards, cfg)
    seconds = time.perf_counter() - tic
    out = {
        "budget": None if chunked is None else chunked.LOGITS_BUDGET,
        "rows": PROMPTS * G, "grad_checkpoint": args.grad_checkpoint,
        "positions_per_chunk": None if chunked is None else chunked.chunk_length(PROMPTS * G, NEW_TOKENS, QWEN25_05B["vocab_size"]),
        "weights_gb": round(weights / 1e9, 3), "update_peak_above_weights_gb": round((mx.get_peak_memory() - weights) / 1e9, 3),
        "update_seconds": round(seconds, 1), "loss": metrics["loss"], "grad_norm": metrics["grad_norm"],
    }
    if args.planner:
        out["planner_gb"] = planner(model, cfg)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
