"""The per-unit memory constants of mlx_grpo/planner/constants.py, from MLX's memory counters.

    uv run python scripts/measure_memory.py           # tiny and small, fitted together

Prints, for builtin:NAME (float32, this backend):
- weights and weights + AdamW state, bytes per parameter;
- the update's forward+backward above the weights (activations and gradients, the real GRPO
  loss of update/step.py) on a grid of micro-batches, fitted over both models (grid points
  where the micro-batch decides the peak) as A * hidden + B * heads * L bytes per token per layer
  (L = padded sequence length), and with grad checkpointing as S * layers * hidden per token + K
  plain layers' A-part + K_att plain layers' B-part, plus G * gradient bytes (a longer grid); and
  the optimizer's own peak (short micro-batches);
- the rollout above the weights (mlx-lm's BatchGenerator, one prefill per prompt), as a
  multiple of the KV cache's own bytes at mlx-lm's 256-token allocation step.

    uv run python scripts/measure_memory.py logits    # LOGIT_COPIES
    uv run python scripts/measure_memory.py bfloat16  # ACT_HALF (slow: bfloat16 on the CPU backend)
    uv run python scripts/measure_memory.py shared    # PREFIX_*, CKPT_SHARED_* (the shared-prefix update)
    uv run python scripts/measure_memory.py compiled-rollout  # COMPILED_ROLLOUT_FACTOR, DECODE_LOGIT_COPIES
    uv run python scripts/measure_memory.py shared-checkpointed  # CKPT_SHARED_* and CKPT_SHARED_LORA_* alone

The completion logits' share of the update, which the built-ins' 322-token vocabulary is too
small to show: the same small random qwen2 (2 layers x 64, its embedding frozen so that no
gradient grows with the vocabulary) at vocabularies of 8,192 and 65,536; the growth of the
update's peak / (rows x padded completion tokens x the vocabulary's growth x 4 bytes) is the
number of float32 [rows, T, vocab] arrays the update holds at its peak. `bfloat16` measures
the update of builtin:small in bfloat16 and float32 at two grid points: their ratio is ACT_HALF.
`shared` measures the shared-prefix update (all of a grid point's rows in one micro-batch) on
tiny and small over prompts per micro-batch, prompt and completion lengths and group sizes, fits
the prompt tokens' constants with the completions at the padded ones, then the checkpointed
update's (full fine-tune and LoRA r8 together).
"""

import argparse

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from mlx_grpo.commands.setup import build_policy
from mlx_grpo.config import load_config
from mlx_grpo.planner import constants, predict, shapes
from mlx_grpo.models.load import checkpoint_layers
from mlx_grpo.rollout.sample import generate_completions, make_rollout_sampler

GRID = [(4, 64), (8, 64), (4, 128), (8, 128), (4, 256), (8, 256)]  # (rows, padded length L)
# grad_checkpoint's grid reaches longer sequences: the recomputed layer's attention and its other
# activations grow apart there (fitted on GRID alone, LoRA at 16 x 384 on tiny came out 23% over)
CKPT_GRID = GRID + [(8, 384), (4, 512)]


def update_peaks(model, cfg, grid=None) -> dict:
    """(rows, L) -> bytes one update (update/step.py's `optimize`: forward, backward, gradient
    accumulation, clipping, AdamW) adds above what is allocated before it, optimizer state made."""
    from mlx_grpo.rollout.sample import Rollout
    from mlx_grpo.update.optimizer import make_optimizer
    from mlx_grpo.update.settings import UpdateSettings
    from mlx_grpo.update.step import optimize

    vocab = model.args.vocab_size
    optimizer = make_optimizer(cfg.training, 100)
    settings = UpdateSettings.from_config(cfg)
    rng = np.random.default_rng(0)
    peaks = {}
    for rows, length in [(4, 64)] + (grid or GRID):  # the first makes the optimizer state, and is measured again
        prompt = rng.integers(3, vocab, length // 2).tolist()
        completions = [rng.integers(3, vocab, length // 2 - 1).tolist() for _ in range(rows)]
        rollout = Rollout([prompt] * rows, completions, [""] * rows, [False] * rows, rows)
        rewards = np.linspace(0, 1, rows).tolist()
        mx.eval(model.parameters())
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        optimize(model, optimizer, None, rollout, rewards, settings)
        peaks[rows, length] = mx.get_peak_memory() - base
        if len(peaks) == 1:
            print(f"  weights + AdamW state {mx.get_active_memory() / sum(v.size for _, v in tree_flatten(model.parameters())):.2f} B/param")
    return peaks


def points(peaks: dict, layers: int, hidden: int, heads: int, grads: int) -> list[tuple]:
    """(rows, L, layers, hidden, heads, gradient bytes, peak bytes) per grid point above the
    optimizer's own peak (where the micro-batch no longer decides the peak)."""
    out = []
    for (rows, length), p in peaks.items():
        print(f"    {rows} x {length}: {p / 1e6:.1f} MB")
        if p > 1.05 * min(peaks.values()) or grads < 1e7:
            out.append((rows, length, layers, hidden, heads, grads, p))
    return out


def fit(pts: list[tuple], features) -> list[float]:
    """Least squares of peak = coef . features(point), on relative errors (tiny and small weigh alike)."""
    xs = np.array([features(*p[:6]) for p in pts], dtype=float)
    ys = np.array([p[6] for p in pts], dtype=float)
    coef, *_ = np.linalg.lstsq(xs / ys[:, None], np.ones(len(ys)), rcond=None)
    worst = max(abs(float(np.dot(coef, x)) / y - 1) for x, y in zip(xs, ys))
    print(f"  {', '.join(f'{c:.3f}' for c in coef)}; worst of {len(ys)} points off by {worst:.1%}")
    return [float(c) for c in coef]


def plain_features(rows, length, layers, hidden, heads, grads):
    """A * hidden + B * heads * L bytes per token per layer (the gradients inside)."""
    return [rows * length * layers * hidden, rows * length * layers * heads * length]


def checkpoint_features(a, b):
    """S * layers * hidden per token + K plain layers' A-part and K_att plain layers' B-part per
    token + G * gradient bytes."""
    def features(rows, length, layers, hidden, heads, grads):
        return [rows * length * layers * hidden, rows * length * a * hidden, rows * length * b * heads * length, grads]
    return features


def rollout_factor(model, tokenizer, args) -> float:
    """Rollout peak above the weights / the KV cache bytes at mlx-lm's 256-token step."""
    rng = np.random.default_rng(1)
    ratios = []
    for prompts, G, prompt_len, new in ((2, 8, 40, 32), (4, 4, 200, 64), (2, 8, 300, 32)):
        ids = [rng.integers(3, args.vocab_size, prompt_len).tolist() for _ in range(prompts)]
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        generate_completions(model, tokenizer, ids, num_generations=G, max_new_tokens=new,
                             sampler=make_rollout_sampler(1.0, 1.0, 0, 0.0))
        extra = mx.get_peak_memory() - base
        head_dim = args.hidden_size // args.num_attention_heads
        slots = -(-(prompt_len + new) // 256) * 256
        kv = prompts * G * slots * args.num_hidden_layers * args.num_key_value_heads * head_dim * 2 * 4
        ratios.append(extra / kv)
        print(f"  rollout {prompts} prompts x G {G}, prompt {prompt_len} + {new}: {extra / 1e6:.1f} MB "
              f"= {extra / kv:.2f} x the KV cache's {kv / 1e6:.1f} MB")
    return float(np.mean(ratios))


def measure(name: str) -> dict[str, list]:
    """Grid points of the padded update (training.shared_prefix off; every grid row repeats one
    prompt, which the default shared-prefix update would run once): full fine-tune and LoRA
    (rank 8, all layers), plain and grad-checkpointed."""
    out = {}
    for lora in (False, True):
        cfg = load_config(None, [f'model.path="builtin:{name}"', f"lora.enabled={str(lora).lower()}",
                                 "training.shared_prefix=false"])
        model, tokenizer, *_ = build_policy(cfg)
        mx.eval(model.parameters())
        params = sum(v.size for _, v in tree_flatten(model.parameters()))
        trainable = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
        args = model.args
        shape = args.num_hidden_layers, args.hidden_size, args.num_attention_heads, 4 * trainable
        kind = "lora" if lora else "full"
        print(f"{name}, {kind}: {params:,} parameters ({trainable:,} trainable), {shape[0]} layers x "
              f"{shape[1]} hidden, {shape[2]} heads; weights {mx.get_active_memory() / params:.2f} B/param")
        if not lora:
            print(f"  rollout factor (mean): {rollout_factor(model, tokenizer, args):.2f}")
        out[kind] = points(update_peaks(model, cfg), *shape)
        checkpoint_layers(model)
        out[kind + " checkpointed"] = points(update_peaks(model, cfg, CKPT_GRID), *shape)
        del model
    return out


def ratio(pts: list[tuple], features, coef: list[float]) -> float:
    """Mean of measured / predicted-as-full-fine-tune over LoRA's points."""
    r = [p[6] / float(np.dot(coef, features(*p[:6]))) for p in pts]
    print(f"  {np.mean(r):.3f} (points {min(r):.3f} to {max(r):.3f})")
    return float(np.mean(r))


def logit_copies(rows: int = 8, prompt: int = 32, completion: int = 96) -> float:
    """Growth of the update's peak with the vocabulary, in float32 [rows, T, vocab] arrays."""
    from mlx_lm.models import qwen2

    from mlx_grpo.rollout.sample import Rollout
    from mlx_grpo.update.optimizer import make_optimizer
    from mlx_grpo.update.settings import UpdateSettings
    from mlx_grpo.update.step import optimize

    cfg = load_config(None, [f"generation.max_new_tokens={completion}", "training.shared_prefix=false"])
    peaks = {}
    for vocab in (8192, 65536):
        mx.random.seed(0)
        model = qwen2.Model(qwen2.ModelArgs(
            model_type="qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=vocab,
            tie_word_embeddings=True))
        model.model.embed_tokens.freeze()
        mx.eval(model.parameters())
        rng = np.random.default_rng(0)
        ids = rng.integers(3, vocab, prompt).tolist()
        completions = [rng.integers(3, vocab, completion).tolist() for _ in range(rows)]
        rollout = Rollout([ids] * rows, completions, [""] * rows, [False] * rows, rows)
        optimizer, settings = make_optimizer(cfg.training, 100), UpdateSettings.from_config(cfg)
        rewards = np.linspace(0, 1, rows).tolist()
        optimize(model, optimizer, None, rollout, rewards, settings)  # makes the AdamW state
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        optimize(model, optimizer, None, rollout, rewards, settings)
        peaks[vocab] = mx.get_peak_memory() - base
        print(f"  vocabulary {vocab:,}: update peak {peaks[vocab] / 1e6:.1f} MB above weights and AdamW state")
        del model, optimizer
    T = -(-completion // 32) * 32
    copies = (peaks[65536] - peaks[8192]) / (rows * T * (65536 - 8192) * 4)
    print(f"logits: {copies:.2f} float32 [{rows}, {T}, vocab] arrays at the update's peak")
    return copies


def _decode_peak(model, vocab: int, prompts: int, G: int, prompt: int, new: int, seed: int = 1) -> float:
    """Peak bytes above what is allocated before one compiled rollout (rollout/engine.py), with
    no stop token, so every row runs to `new` tokens."""
    from mlx_grpo.rollout import engine

    rng = np.random.default_rng(seed)
    ids = [rng.integers(3, vocab, prompt).tolist() for _ in range(prompts)]
    mx.eval(model.parameters())
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    engine.decode(model, ids, group_size=G, max_new_tokens=new, sampler=make_rollout_sampler(1.0, 1.0, 0, 0.0),
                  eos=set(), logprob=None)
    return mx.get_peak_memory() - base


def compiled_rollout() -> None:
    """COMPILED_ROLLOUT_FACTOR: the compiled rollout's peak over its key/value buffers (rows x
    (prompt columns rounded up to the engine's PROMPT_BUCKET + new tokens)) on builtin:tiny and
    builtin:small, each less its decode logits; and DECODE_LOGIT_COPIES: the peak's growth with the
    vocabulary (a 2-layer random qwen2 at 8,192 and 65,536) in float32 [rows, vocab] arrays."""
    from mlx_lm.models import qwen2

    from mlx_grpo.models.named import load_model
    from mlx_grpo.rollout import engine

    shapes_ = ((2, 8, 40, 32), (4, 4, 200, 64), (2, 8, 300, 32), (4, 4, 60, 32))
    mx.random.seed(0)
    copies = {}
    for vocab in (8192, 65536):
        model = qwen2.Model(qwen2.ModelArgs(
            model_type="qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=vocab,
            tie_word_embeddings=True))
        copies[vocab] = _decode_peak(model, vocab, 2, 8, 40, 32)
    per_vocab = (copies[65536] - copies[8192]) / (16 * (65536 - 8192) * 4)
    print(f"decode logits: {per_vocab:.2f} float32 [rows, vocab] arrays at the rollout's peak")
    ratios = []
    for name in ("tiny", "small"):
        a = load_model(f"builtin:{name}").model.args
        model = load_model(f"builtin:{name}").model
        per_token = a.num_hidden_layers * a.num_key_value_heads * (a.hidden_size // a.num_attention_heads) * 2 * 4
        for prompts, G, prompt, new in shapes_:
            peak = _decode_peak(model, a.vocab_size, prompts, G, prompt, new)
            columns = -(-(prompt - 1) // engine.PROMPT_BUCKET) * engine.PROMPT_BUCKET + new
            kv = prompts * G * columns * per_token
            ratios.append((peak - per_vocab * prompts * G * a.vocab_size * 4) / kv)
            print(f"  {name} {prompts} prompts x G {G}, prompt {prompt} + {new}: {peak / 1e6:.2f} MB "
                  f"= {peak / kv:.2f} x its buffers' {kv / 1e6:.2f} MB")
    print(f"compiled rollout factor: mean {np.mean(ratios):.2f}, {min(ratios):.2f}-{max(ratios):.2f}")


def half_ratio() -> float:
    """bfloat16's update peak / float32's, builtin:small, full fine-tune, 8 x 128 and 8 x 256."""
    global GRID
    GRID = [(8, 128), (8, 256)]
    peaks = {}
    for dtype in ("float32", "bfloat16"):
        cfg = load_config(None, ['model.path="builtin:small"', f'model.dtype="{dtype}"',
                                 "training.shared_prefix=false"])
        model, *_ = build_policy(cfg)
        peaks[dtype] = update_peaks(model, cfg)
        del model
    ratios = [peaks["bfloat16"][k] / peaks["float32"][k] for k in GRID]
    print(f"bfloat16 / float32 update peak: {', '.join(f'{r:.3f}' for r in ratios)}")
    return float(np.mean(ratios))


# (prompts per micro-batch, prompt tokens, completion tokens, completions a prompt); small's above
# the optimizer step's own peak, where the micro-batch decides it
SHARED_PLAIN = {
    "tiny": [(1, 32, 32, 4), (2, 32, 32, 4), (4, 32, 32, 4), (1, 160, 32, 4), (1, 320, 32, 4), (2, 320, 32, 4),
             (4, 320, 32, 4), (1, 320, 96, 4), (4, 32, 96, 4), (4, 160, 64, 4), (2, 96, 96, 4), (1, 32, 32, 8),
             (2, 32, 32, 8), (1, 320, 32, 8), (2, 320, 32, 8), (2, 160, 64, 8), (1, 96, 96, 8), (2, 32, 32, 2),
             (8, 32, 32, 2), (4, 320, 32, 2), (8, 320, 32, 2), (8, 160, 64, 2),
             (4, 512, 64, 4), (8, 512, 64, 4), (16, 512, 64, 4), (4, 512, 32, 8)],
    "small": [(2, 320, 32, 4), (4, 320, 32, 4), (1, 320, 96, 4), (4, 32, 96, 4), (4, 160, 64, 4), (2, 96, 96, 4),
              (2, 512, 64, 4), (4, 512, 32, 4)],
}
SHARED_CHECKPOINTED = {
    "tiny": SHARED_PLAIN["tiny"][:11],
    "small": [(4, 320, 32, 4), (8, 320, 32, 4), (4, 160, 64, 4), (8, 32, 96, 4), (8, 96, 64, 4)],
}


def shared_peaks(name: str, sets: list[str], grid: list[tuple]) -> list[tuple]:
    """(ModelShape, RunShape, peak bytes above what is allocated before the update) of each grid
    point: one step's update with shared prefixes, all rows in one micro-batch (under
    grad_checkpoint, one group's: update/batches.py)."""
    from mlx_grpo.models.load import resolve_model_path
    from mlx_grpo.update.optimizer import make_optimizer
    from mlx_grpo.update.settings import UpdateSettings
    from mlx_grpo.update.step import optimize

    shape = shapes.read_model_shape(resolve_model_path(f"builtin:{name}"))
    cfg = load_config(None, [f'model.path="builtin:{name}"', "training.shared_prefix=true", *sets])
    model, *_ = build_policy(cfg)
    optimizer, settings = make_optimizer(cfg.training, 100), UpdateSettings.from_config(cfg)
    rng, out = np.random.default_rng(0), []
    for i, (groups, p, t, G) in enumerate([(1, 32, 32, 4)] + grid):  # the first makes the optimizer state
        rollout = _shared_rollout(rng, model.args.vocab_size, groups, p, t, G)
        mx.eval(model.parameters())
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        optimize(model, optimizer, None, rollout, np.linspace(0, 1, groups * G).tolist(), settings)
        if i:
            cfg.training.prompts_per_step, cfg.generation.num_generations = groups, G
            cfg.data.max_prompt_tokens, cfg.generation.max_new_tokens = p, t
            out.append((shape, shapes.run_shape(cfg), mx.get_peak_memory() - base))
    del model
    return out


def _shared_rollout(rng, vocab: int, groups: int, prompt: int, completion: int, G: int):
    """`groups` random prompts of `prompt` tokens, each with G random completions of `completion`."""
    from mlx_grpo.rollout.sample import Rollout

    prompts = [ids for _ in range(groups) for ids in [rng.integers(3, vocab, prompt).tolist()] * G]
    rows = len(prompts)
    return Rollout(prompts, [rng.integers(3, vocab, completion).tolist() for _ in range(rows)], [""] * rows,
                   [False] * rows, G)


def shared_fit(pts: list[tuple], features, fixed) -> list[float]:
    """Least squares on relative errors of peak = coef . features + fixed (bytes the formula
    takes as known: the logits, the gradients, the completions' plain layers)."""
    xs = np.array([features(s, r) for s, r, _ in pts], dtype=float)
    ys = np.array([y - fixed(s, r) for s, r, y in pts], dtype=float)
    peaks = np.array([y for *_, y in pts], dtype=float)
    coef, *_ = np.linalg.lstsq(xs / peaks[:, None], ys / peaks, rcond=None)
    errors = (xs @ coef - ys) / peaks
    print(f"  {', '.join(f'{c:.3f}' for c in coef)}; {len(ys)} points, "
          f"off by {errors.min():+.1%} to {errors.max():+.1%}")
    return [float(c) for c in coef]


def _logits(s, r) -> float:
    rows, _ = predict.micro_batch_rows(r)
    return rows * predict._pad(r.max_new, constants.PAD_TO) * s.vocab * 4 * constants.LOGIT_COPIES


def _counts(r) -> tuple:
    """predict._shared_counts of a grid point's micro-batch: all its rows, or under grad_checkpoint
    one group's."""
    return predict._shared_counts(r, *predict.micro_batch_rows(r))


def _prompt_features(s, r) -> list:
    """Prompt tokens and their keys, in every layer but the last (PREFIX_HIDDEN, PREFIX_ATTENTION)."""
    pt, pa, _, _ = _counts(r)
    return [(s.layers - 1) * s.hidden * pt, (s.layers - 1) * s.heads * pa]


def _completions(s, r) -> float:
    """What the plain fit takes as known: the completions' layers at the padded constants, the logits."""
    _, _, ct, ca = _counts(r)
    return _logits(s, r) + s.layers * predict._layer_bytes(s, ct, ca)


def _checkpointed_features(s, r) -> list:
    """Tokens in every layer (CKPT_SHARED_STORED) and the micro-batch's plain layer (CKPT_SHARED_LAYERS)."""
    pt, _, ct, _ = _counts(r)
    return [s.layers * s.hidden * (pt + ct), sum(predict._shared_layer(s, r, *predict.micro_batch_rows(r)))]


def _checkpointed_known(s, r) -> float:
    """The checkpointed fit's known part: logits, gradients (and the sum of them over several
    micro-batches), the per-row key and value copies."""
    rows, _ = predict.micro_batch_rows(r)
    grads = (constants.CKPT_GRADS + (r.part_rows > rows)) * 4 * shapes.trainable_params(s, r)
    return _logits(s, r) + grads + predict._key_copies(s, r, rows)


def _above_optimizer(pts: list[tuple]) -> list[tuple]:
    """The points whose peak the micro-batch decides, not the optimizer step."""
    return [p for p in pts if p[2] > 1.05 * constants.OPTIMIZER_STEP * 4 * shapes.trainable_params(p[0], p[1])]


def shared_prefix() -> None:
    """PREFIX_HIDDEN, PREFIX_ATTENTION (plain layers), then with them CKPT_SHARED_STORED,
    CKPT_SHARED_LAYERS (grad_checkpoint, full fine-tune and LoRA r8) of mlx_grpo/planner/constants.py,
    fitted on tiny and small."""
    plain = _above_optimizer([p for name, grid in SHARED_PLAIN.items() for p in shared_peaks(name, [], grid)])
    print("shared prefix, plain: PREFIX_HIDDEN, PREFIX_ATTENTION =")
    constants.PREFIX_HIDDEN, constants.PREFIX_ATTENTION = shared_fit(plain, _prompt_features, _completions)
    shared_checkpointed()


def shared_checkpointed() -> None:
    """CKPT_SHARED_STORED, CKPT_SHARED_LAYERS (full fine-tune) and CKPT_SHARED_LORA_* (LoRA r8, one
    group per micro-batch), with PREFIX_* as constants.py has them."""
    sets = ["training.grad_checkpoint=true"]
    for name, extra, keys in (("full", [], "CKPT_SHARED_STORED, CKPT_SHARED_LAYERS"),
                              ("LoRA r8", ["lora.enabled=true"], "CKPT_SHARED_LORA_STORED, CKPT_SHARED_LORA_LAYERS")):
        ckpt = [p for model, grid in SHARED_CHECKPOINTED.items() for p in shared_peaks(model, [*sets, *extra], grid)]
        print(f"shared prefix, grad_checkpoint ({name}): {keys} =")
        shared_fit(_above_optimizer(ckpt), _checkpointed_features, _checkpointed_known)


def main(names: list[str]):
    pts = {}
    for name in names:
        for kind, p in measure(name).items():
            pts.setdefault(kind, []).extend(p)
    print("update, plain: A, B =")
    a, b = fit(pts["full"], plain_features)
    print("update, grad_checkpoint: S, K, K_att, G =")
    ckpt = fit(pts["full checkpointed"], checkpoint_features(a, b))
    print("LoRA's update / the full fine-tune's formula, plain:")
    ratio(pts["lora"], plain_features, [a, b])
    print("LoRA's update / the full fine-tune's formula, grad_checkpoint:")
    ratio(pts["lora checkpointed"], checkpoint_features(a, b), ckpt)


MODES = {"logits": logit_copies, "bfloat16": half_ratio, "shared": shared_prefix,
         "compiled-rollout": compiled_rollout, "shared-checkpointed": shared_checkpointed}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("what", nargs="*", default=["tiny", "small"], metavar="MODEL_OR_MODE",
                   help=f"builtin model names to fit on (default: tiny small), or one mode of {', '.join(MODES)}")
    args = p.parse_args(argv)
    modes = [w for w in args.what if w in MODES]
    if modes and len(args.what) > 1:
        p.error(f"a mode ({modes[0]}) runs alone")
    if bad := [w for w in args.what if w not in MODES and w not in ("tiny", "small")]:
        p.error(f"unknown model or mode {bad[0]!r}: give tiny, small or one of {', '.join(MODES)}")
    return args.what


if __name__ == "__main__":
    what = parse_args()
    MODES[what[0]]() if what[0] in MODES else main(what)
