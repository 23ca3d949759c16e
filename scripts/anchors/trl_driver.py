"""TRL's GRPOTrainer on the CPU with PyTorch, timed per optimizer step.

A transformers TrainerCallback takes the time at each `on_step_end`; one step is the
interval between two of them (the first from `on_train_begin`): generation with
`model.generate`, rewards, the old/reference log-probs, the loss, backward and the AdamW
update, and TRL's logging. The model folder is linked into a scratch folder whose
config.json adds "architectures" (TRL needs it; MLX-written configs lack it). Excluded: imports, model and reference load, dataset
preparation, the first `--warmup` steps. Torch runs with `--threads` intra-op threads.
The rewards are two small functions written here (final-number match, answer-tag format),
close to mlx-grpo's gsm8k_correctness and xml_format in cost.
"""

import re
import shutil
import sys
from pathlib import Path

from common import chat_rows, linked_model, parser, report, step_clock

ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S)


def correctness(completions, answer, **kwargs):
    out = []
    for c, a in zip(completions, answer):
        m = ANSWER.search(c[0]["content"] if isinstance(c, list) else c)
        out.append(1.0 if m and m.group(1).strip() == a else 0.0)
    return out


def tag_format(completions, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [0.5 * (("<reasoning>" in t) + ("</reasoning>" in t) + ("<answer>" in t) + ("</answer>" in t)) / 4
            for t in texts]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    a = p.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    from datasets import Dataset
    from importlib.metadata import version
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    ds = Dataset.from_list(chat_rows(a.data))
    work = Path(a.workdir) / "trl"
    shutil.rmtree(work, ignore_errors=True)
    model = linked_model(a.model, work / "model", {"config.json": {"architectures": ["Qwen2ForCausalLM"]}})
    steps = a.warmup + a.steps
    cfg = GRPOConfig(
        output_dir=str(work), use_cpu=True, bf16=False, fp16=False, report_to="none", save_strategy="no",
        logging_steps=1, max_steps=steps, per_device_train_batch_size=a.prompts * a.generations,
        num_generations=a.generations, max_completion_length=a.max_new_tokens, beta=a.beta,
        learning_rate=1e-6, temperature=1.0, seed=0, dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.float32},
    )
    clock, stamps, tokens = step_clock(TrainerCallback)

    peft = None
    if a.lora_rank:  # every linear layer of every block, as mlx-grpo's LoRA
        from peft import LoraConfig

        peft = LoraConfig(r=a.lora_rank, lora_alpha=2 * a.lora_rank, lora_dropout=0.0, target_modules="all-linear",
                          task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=str(model), reward_funcs=[correctness, tag_format], args=cfg, train_dataset=ds,
                          callbacks=[clock], peft_config=peft)
    n = sum(x.numel() for x in trainer.model.parameters() if x.requires_grad)
    print(f"anchor: {n:,} trainable parameters, dtype {next(trainer.model.parameters()).dtype}, "
          f"torch threads {torch.get_num_threads()}", file=sys.stderr, flush=True)
    trainer.train()
    seconds = [b - a_ for a_, b in zip(stamps, stamps[1:])]
    report(f"TRL ({a.threads} thread)", version("trl"), seconds, a.warmup,
           "one optimizer step: generate, rewards, reference log-probs, loss+backward, AdamW, logging",
           completion_tokens=tokens, torch=version("torch"), transformers=version("transformers"),
           threads=a.threads, trainable_parameters=n,
           excluded=f"imports, model and reference load, dataset, first {a.warmup} step(s)")


if __name__ == "__main__":
    main()
