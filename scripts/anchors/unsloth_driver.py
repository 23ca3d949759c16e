"""Unsloth's MLX GRPO (unsloth_zoo.mlx.trainer.MLXGRPOTrainer), timed per optimizer step.

Unsloth's MLX backend is meant for Apple Silicon: `import unsloth` takes its MLX path only
when `platform.system()` is "Darwin" and `platform.machine()` is "arm64" (else it goes for
torch and a GPU). Here both answer so only while `unsloth` and `unsloth_zoo.mlx.trainer`
are imported, and are restored right after; MLX itself then runs on its CPU backend. (TRL's
GRPOTrainer is stubbed out by `import unsloth` on MLX; its MLX GRPO trainer is unsloth_zoo's
MLXGRPOTrainer with MLXGRPOConfig, TRL's GRPOConfig fields.)

The model is loaded with `FastLanguageModel.from_pretrained(folder, dtype="float32",
load_in_4bit=False, full_finetuning=rank == 0)`; with --lora-rank R, `get_peft_model(r=R,
lora_alpha=2R, target_modules="all-linear")` puts LoRA on every linear layer of every block
(not lm_head, as PEFT's all-linear). One step is one generation of P*G completions
(per_device_train_batch_size = P*G, gradient_accumulation_steps = 1, num_generations = G)
and one AdamW update. Unsloth's defaults are kept otherwise: loss_type "dapo", its compiled
step (compile=True), its chunked cross-entropy (use_cce=True), gradient checkpointing on
(`--no-grad-checkpoint` turns it off, in get_peft_model and in the config; its compile
auto-tune may turn it back on: the result line gives what the trainer's args held after
training), learning rate 1e-6 with no warm-up, temperature 1.0, top_p 1.0, no top_k. With beta != 0 the
reference is the starting weights (full fine-tune) or the model with its adapters disabled
(LoRA). The rewards are the same two small functions as trl_driver.py's, in TRL's contract.

The clock: a callback (Unsloth's HF-style on_train_begin / on_step_end) takes the time at the
start of training and at the end of each optimizer step; one step is the interval between two
of them: generation (unsloth_zoo's batched MLX generation), rewards, advantages, reference
log-probs, the loss and gradient, the AdamW update, and the trainer's per-step logging.
Excluded: imports, model load, LoRA setup, dataset encoding and the trainer's planning before
on_train_begin, the first --warmup steps (its compile), the adapter/model save after training.
"""

import platform
import shutil
import sys
from pathlib import Path

from common import chat_rows, parser, report, step_clock
from trl_driver import correctness, tag_format


def import_unsloth():
    """`import unsloth` (and the MLX GRPO trainer) as on an Apple Silicon Mac; see the docstring."""
    system, machine = platform.system, platform.machine
    platform.system, platform.machine = (lambda: "Darwin"), (lambda: "arm64")
    try:
        import unsloth
        from unsloth_zoo.mlx.trainer import MLXGRPOConfig, MLXGRPOTrainer
    finally:
        platform.system, platform.machine = system, machine
    if getattr(unsloth, "DEVICE_TYPE", None) != "mlx":
        sys.exit(f"unsloth took its {getattr(unsloth, 'DEVICE_TYPE', '?')} path, not MLX")
    return unsloth, MLXGRPOConfig, MLXGRPOTrainer


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--no-grad-checkpoint", action="store_true",
                   help="gradient_checkpointing=False (Unsloth's default is on)")
    a = p.parse_args()
    unsloth, MLXGRPOConfig, MLXGRPOTrainer = import_unsloth()
    import mlx.core as mx
    from importlib.metadata import version

    from datasets import Dataset

    ds = Dataset.from_list(chat_rows(a.data))
    work = Path(a.workdir) / "unsloth"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    gc = not a.no_grad_checkpoint
    model, tokenizer = unsloth.FastLanguageModel.from_pretrained(
        a.model, max_seq_length=2048, dtype="float32", load_in_4bit=False, full_finetuning=a.lora_rank == 0)
    if a.lora_rank:
        model = unsloth.FastLanguageModel.get_peft_model(
            model, r=a.lora_rank, lora_alpha=2 * a.lora_rank, lora_dropout=0.0, target_modules="all-linear",
            use_gradient_checkpointing="mlx" if gc else False)
    steps = a.warmup + a.steps
    cfg = MLXGRPOConfig(
        output_dir=str(work / "out"), max_steps=steps, per_device_train_batch_size=a.prompts * a.generations,
        gradient_accumulation_steps=1, num_generations=a.generations, max_completion_length=a.max_new_tokens,
        beta=a.beta, learning_rate=1e-6, warmup_steps=0, temperature=1.0, seed=0, logging_steps=1,
        report_to="none", gradient_checkpointing=gc, max_seq_length=2048,
    )
    clock, stamps, tokens = step_clock()

    trainer = MLXGRPOTrainer(model=model, tokenizer=tokenizer, train_dataset=ds, args=cfg,
                             reward_funcs=[correctness, tag_format], callbacks=[clock])
    from mlx.utils import tree_flatten

    n = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
    dtypes = sorted({str(v.dtype) for _, v in tree_flatten(model.parameters())})
    print(f"anchor: {n:,} trainable parameters, dtypes {dtypes}, device {mx.default_device()}, "
          f"gradient checkpointing {'on' if gc else 'off'}", file=sys.stderr, flush=True)
    trainer.train()
    used_gc = bool(trainer.args.gradient_checkpointing)  # after any auto-tune of its own
    if used_gc != gc:
        print(f"anchor: the trainer turned gradient checkpointing {'on' if used_gc else 'off'}", file=sys.stderr)
    seconds = [b - a_ for a_, b in zip(stamps, stamps[1:])]
    name = "Unsloth MLX GRPO" + (", no grad checkpoint" if a.no_grad_checkpoint else "")
    report(name, version("unsloth"), seconds, a.warmup,
           "one optimizer step: generate, rewards, reference log-probs, loss+grad, AdamW, logging",
           completion_tokens=tokens, mlx=version("mlx"), mlx_lm=version("mlx-lm"),
           unsloth_zoo=version("unsloth_zoo"), transformers=version("transformers"), trainable_parameters=n,
           gradient_checkpointing=used_gc,
           excluded=f"imports, model load, LoRA setup, dataset encoding and planning, first {a.warmup} step(s), "
                    "the save after training")


if __name__ == "__main__":
    main()
