"""The memory planner's per-unit constants, each with where it was measured.

Every one was measured on MLX's CPU backend (float32, mlx 0.32.4, mlx-lm 0.32.2) with
`uv run python scripts/measure_memory.py`, on builtin:tiny (4 layers x 128) and builtin:small
(8 x 512) fitted together. predict.py reads them through this module, so a script that refits
one (measure_memory.py) sets it here.
"""

# Update (forward + backward + gradient accumulation of one micro-batch, real GRPO loss, through
# update/step.py's `optimize`, training.shared_prefix off), bytes per token per layer = ACT_HIDDEN *
# hidden + ACT_ATTENTION * heads * L (L: padded sequence length). Least squares over relative error
# on the 10 grid points where the micro-batch decides the peak (tiny 4-8 rows x 64-256 tokens, small
# 4-8 x 128-256); worst point 9.3% off. The gradients this pass holds are inside the fit.
ACT_HIDDEN = 111.7
ACT_ATTENTION = 7.686
# grad_checkpoint: bytes per token = CKPT_STORED * layers * hidden (each block's kept input) +
# CKPT_LAYERS plain layers' ACT_HIDDEN part and CKPT_ATTENTION plain layers' ACT_ATTENTION part (the
# block being recomputed and its gradient) + CKPT_GRADS * the trainable parameters' bytes; the grid
# with checkpointing on, and 8 x 384, 4 x 512 (12 points), worst 2.6% off. One multiple of a whole
# layer (2.33, fitted to 256 tokens) over-predicted LoRA at 384 tokens by 18-23%: the recomputed
# block's attention scores are held fewer times than its other activations.
CKPT_STORED = 5.328
CKPT_LAYERS = 2.604
CKPT_ATTENTION = 1.641
CKPT_GRADS = 0.468
# Shared prefix (training.shared_prefix, algorithm/prefix.py): a micro-batch's prompts run once
# each, together, padded to `prefix_columns`, with no head, and their last layer feeds only keys and
# values, so a prompt token counts over layers - 1 at PREFIX_HIDDEN * hidden + PREFIX_ATTENTION *
# heads per key (C tokens over C keys, C the padded columns); each completion input counts over all
# layers at ACT_HIDDEN, ACT_ATTENTION, over the prompt's C keys and its own. Least squares by
# `scripts/measure_memory.py shared` (tiny and small, G 2-8, 1-16 prompts, prompts 32-512,
# completions 32-96; 34 points), the completions held at the padded constants: -10.5% to +11.9%
# off. (Fitted when each group ran on its own, 100.09 and 4.481: the groups' backward passes now run
# as one, and their transients are alive together.) A prompt token charged as a padded one
# (ACT_HIDDEN, all layers) over-predicted 333-token prompts by 37%.
PREFIX_HIDDEN = 114.228
PREFIX_ATTENTION = 7.715
# grad_checkpoint with shared prefixes: bytes per token (prompt columns once, completion inputs) =
# CKPT_SHARED_STORED * layers * hidden, plus each layer's concatenated prompt + completion keys and
# values for every row (a checkpointed block's outputs, kept to the backward: counted, not fitted),
# plus CKPT_SHARED_LAYERS plain layers of the whole micro-batch (prefix.py runs its groups as one
# pass, so the recomputation holds all of them), plus CKPT_GRADS * the gradients: least squares by
# `scripts/measure_memory.py shared` (tiny full and LoRA r8, small full; 27 points): -13.9% to
# +14.7% off.
CKPT_SHARED_STORED = 15.020
CKPT_SHARED_LAYERS = 1.572
# The same two under LoRA, whose shared-prefix micro-batches hold one group each under
# grad_checkpoint (update/batches.py): least squares by `scripts/measure_memory.py
# shared-checkpointed` on tiny and small LoRA r8, one group per micro-batch, the gradient summed
# over them counted (16 points): -9.8% to +10.2% off. The full fine-tune's pair above is 05de8fd's
# fit (one-pass LoRA points in it); on the 16 full fine-tune points of that run it is -7.6% to
# +6.8% off, but for tiny's smallest (1 group of 4 x 32 + 32 tokens, -37.1%).
CKPT_SHARED_LORA_STORED = 12.577
CKPT_SHARED_LORA_LAYERS = 1.540
# LoRA (rank 8, all layers) on the same grid, measured / the formulas above with its trainable
# parameters: 0.948 plain (points 0.87-1.04), 0.887 checkpointed (0.84-0.95, the longer grid). Under
# shared prefixes the checkpointed LoRA update has its own pair above, and no ratio.
LORA_PLAIN = 0.948
LORA_CHECKPOINTED = 0.887
# The same update's activations in a 2-byte dtype (bfloat16, float16), as a share of float32's:
# 0.557 and 0.553 on builtin:small (full fine-tune, 8 x 128 and 8 x 256 tokens; bfloat16 / float32
# peak above the weights, this CPU backend), applied to LoRA and grad checkpointing unmeasured.
ACT_HALF = 0.555
# The optimizer part of an update (accumulated, clipped gradients and AdamW's temporaries), in
# trainable-parameter bytes above weights + AdamW state: 239 MB / 101.4 MB on builtin:small,
# where short micro-batches stop growing the peak below it.
OPTIMIZER_STEP = 2.36
# Rollout peak above the weights / the KV cache at mlx-lm's 256-token allocation step: 2.08 on
# builtin:small (1.38-2.31 over 3 shapes and two runs; builtin:tiny 1.24-1.57): the batch cache is built by
# copying the per-prompt caches, and the decode step's logits come on top.
ROLLOUT_FACTOR = 2.08
KV_STEP = 256
# The compiled rollout (rollout/engine.py, generation.engine's default where a model's layers keep
# plain KV caches): its peak above the weights over its key/value buffers, allocated once at rows x
# (prompt columns rounded up to PROMPT_BUCKET + new tokens), less its decode logits: mean 1.12
# (1.06-1.24, 8 points on builtin:tiny and builtin:small), plus DECODE_LOGIT_COPIES float32
# [rows, vocab] arrays (2.02: the growth of the peak from an 8,192- to a 65,536-token vocabulary);
# `scripts/measure_memory.py compiled-rollout`. BatchGenerator's peak on the same 8 points was 2.1-6.2x.
COMPILED_ROLLOUT_FACTOR = 1.12
DECODE_LOGIT_COPIES = 2.02
PROMPT_BUCKET = 32  # rollout/engine.py's
# Completion logits held at the update's peak while they fit one chunk (algorithm/chunked.py: a
# chunk holds LOGITS_BUDGET logit elements), in float32 [rows, T, vocab] arrays: 3 (the logits,
# their gradient, the entropy's softmax, as the code reads), and measured 3.00 by
# `scripts/measure_memory.py logits` before chunking (the peak's growth from a 8,192- to a
# 65,536-token vocabulary, 8 rows x 96 and 4 x 192 completion tokens, a 2 x 64 random qwen2). On
# the built-ins' 322-token vocabulary they are under 3% of the update and inside ACT_HIDDEN.
LOGIT_COPIES = 3
# Past one chunk, the update holds about CHUNK_COPIES chunk-sized float32 arrays at its peak
# whatever the rows and tokens (MLX's CPU backend allocates the next ~10 operations' outputs before
# they run): measured 11.0 on the padded path and 8.0 with shared prefixes, 4-32 positions of 8
# rows x 65,536 (scripts/logits_peak.py). A trainable head (a full fine-tune) also accumulates its
# gradient over the chunks: HEAD_GRAD_COPIES float32 [vocab, hidden] arrays, measured 2.7.
LOGITS_BUDGET = 1 << 24  # as algorithm/chunked.py
CHUNK_COPIES = {False: 11.0, True: 8.0}  # by training.shared_prefix
HEAD_GRAD_COPIES = 2.7
PAD_TO = 32  # update/batches.py pads sequences to a multiple of 32
GB = 1e9
