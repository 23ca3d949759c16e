"""MLX-GRPO (the single-file trainer mlx-grpo.py, GitHub repository Doriandarko/MLX-GRPO), timed per step.

Its trainer takes one prompt per `train_step` (G completions, generated one by one with
mlx-lm's `generate`; old log-probs; rewards; loss and gradient against the reference model;
an update every `gradient_accumulation_steps` prompts), so one step here is P calls of
`train_step` with gradient_accumulation_steps = P: P*G completions and one Adam update, as
in the other tools. Its own defaults are kept otherwise (`use_compile = True`,
`quantize_for_rollouts = True`: the rollout and reference copies are 4-bit), except
temperature 1.0, no evaluation, no checkpoints and no JSONL log. Its `train_step` catches
its own exceptions and prints "Training step failed"; the driver stops if that or another
failure line appears, so a failed step is never timed. Excluded: model load and the
trainer's construction (its copies and quantization), the first `--warmup` steps. The model
folder is linked into a scratch folder whose tokenizer_config.json names the tokenizer class
PreTrainedTokenizerFast (transformers 4, its lock, does not know transformers 5's name).
"""

import contextlib
import io
import shutil
import sys
import time
import types
from pathlib import Path

from common import linked_model, parser, read_rows, report

FAILED = ("Training step failed", "Generation ", "Log prob computation failed", "Reward function failed")


NUDGE = '        formatted_prompt = formatted_prompt + "<reasoning>"\n'


def load_source(path: str, no_nudge: bool):
    """mlx-grpo.py as a module, optionally without the line that appends "<reasoning>" to every
    rollout prompt. (builtin:tiny's tokenizer splits a bare "<reasoning>" unlike the
    "<reasoning>\\n" it was trained on, and the model then ends every completion at once.)"""
    src = Path(path).read_text()
    if no_nudge:
        if NUDGE not in src:
            sys.exit(f"{path}: the nudge line {NUDGE.strip()!r} is not there")
        src = src.replace(NUDGE, "")
    m = types.ModuleType("mlx_grpo_anchor")
    m.__file__ = path
    sys.modules[m.__name__] = m
    exec(compile(src, path, "exec"), m.__dict__)
    return m


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--source", required=True, help="MLX-GRPO's mlx-grpo.py")
    p.add_argument("--no-nudge", action="store_true",
                   help=f"drop the line {NUDGE.strip()!r} from its source before running it")
    a = p.parse_args()
    m = load_source(a.source, a.no_nudge)
    import mlx.core as mx
    from importlib.metadata import version

    work = Path(a.workdir) / "mlx-grpo-anchor"
    shutil.rmtree(work, ignore_errors=True)
    # transformers 4 (its lock) does not know the class name transformers 5 wrote; the same
    # tokenizer.json loads as PreTrainedTokenizerFast
    model_dir = linked_model(a.model, work / "model", {"tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast"}})
    cfg = m.MLXGRPOConfig(
        model_name=str(model_dir), output_dir=str(work), num_generations=a.generations, max_new_tokens=a.max_new_tokens,
        kl_coeff=a.beta, temperature=1.0, gradient_accumulation_steps=a.prompts, batch_size=1,
        eval_every_updates=0, eval_steps=10 ** 9, save_steps=10 ** 9, log_jsonl=False, seed=0,
    )
    mx.random.seed(cfg.seed)
    rows = read_rows(a.data)
    data = [{"prompt": [{"role": "system", "content": r["system"]}, {"role": "user", "content": r["question"]}],
             "answer": r["answer"]} for r in rows]
    model, tokenizer = m.load_model(cfg.model_name)
    trainer = m.MLXGRPOTrainer(model=model, tokenizer=tokenizer, reward_funcs=[
        m.correctness_reward_func, m.xmlcount_reward_func, m.soft_format_reward_func, m.int_reward_func,
    ], args=cfg, train_dataset=data, eval_dataset=None)

    made = []
    generate = trainer.generate_responses

    def counted(batch):
        responses, old, prompt = generate(batch)
        made.extend(len(tokenizer.encode(r)) for r in responses)
        return responses, old, prompt

    trainer.generate_responses = counted
    seconds, tokens = [], []
    for step in range(a.warmup + a.steps):
        made.clear()
        buf = io.StringIO()
        tic = time.perf_counter()
        with contextlib.redirect_stdout(buf):
            for i in range(a.prompts):
                trainer.train_step(data[(step * a.prompts + i) % len(data)])
        seconds.append(time.perf_counter() - tic)
        out = buf.getvalue()
        bad = [line for line in out.splitlines() if line.startswith(FAILED)]
        if bad or trainer.update_step != step + 1:
            sys.stderr.write(out)
            sys.exit(f"MLX-GRPO step {step + 1} failed ({trainer.update_step} updates): {bad[:3]}")
        tokens.append(sum(made) / len(made))
        print(f"anchor: step {step + 1}: {seconds[-1]:.3f} s, {tokens[-1]:.1f} tokens per completion",
              file=sys.stderr, flush=True)
    report("MLX-GRPO" + (", no <reasoning> nudge" if a.no_nudge else ""), "mlx-grpo.py " + getattr(m, "__version__", "0.2.0 (pyproject)"), seconds, a.warmup,
           f"{a.prompts} train_step calls (one per prompt) and one Adam update: generation with old log-probs, "
           "rewards, loss+grad with reference pass",
           completion_tokens=tokens, tokens_note="its completion texts re-encoded, as its loss scores them",
           mlx=version("mlx"), mlx_lm=version("mlx-lm"),
           excluded=f"model load, trainer construction (copies, 4-bit quantization), first {a.warmup} step(s)")


if __name__ == "__main__":
    main()
