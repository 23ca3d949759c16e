"""mlx-lm-lora's GRPO (`mlx_lm_lora.train --train-mode grpo --train-type full`), timed per iteration.

Runs the command-line tool's own path (`mlx_lm_lora.train.run`: load, reference model,
dataset, `train_grpo`) with the arguments its parser would give, plus a training callback.
With one report per iteration, the trainer's own clock (`iterations_per_second`, reset after
each report) times one iteration: generation (`generate_grpo`), rewards, the loss and gradient
with the reference pass, the optimizer update and the `mx.eval` of its state. Excluded: model
and reference loading, dataset tokenizing, the first `--warmup` iterations, the report printing.
Sampling is the tool's: temperature set to 1.0 here; top_p 0.95 and top_k 20 are its
GRPOTrainingArgs defaults, which its command line does not pass on.
"""

import json
import shutil
import sys
import types
from pathlib import Path

from common import parser, read_rows, report


def main() -> None:
    a = parser(__doc__.splitlines()[0]).parse_args()
    from importlib.metadata import version

    from mlx_lm.tuner.callbacks import TrainingCallback
    from mlx_lm_lora import train as cli

    work = Path(a.workdir) / "mlx-lm-lora"
    shutil.rmtree(work, ignore_errors=True)
    (work / "data").mkdir(parents=True)
    rows = read_rows(a.data)
    with open(work / "data" / "train.jsonl", "w") as f:
        for r in rows:  # GRPODataset's keys: prompt, answer, system
            f.write(json.dumps({"prompt": r["question"], "answer": r["answer"], "system": r["system"]}) + "\n")

    iters = a.warmup + a.steps
    args = vars(cli.build_parser().parse_args([
        "--model", a.model, "--train", "--train-mode", "grpo", "--train-type", "lora" if a.lora_rank else "full",
        "--num-layers", "-1",
        "--data", str(work / "data"), "--batch-size", str(a.prompts), "--group-size", str(a.generations),
        "--max-completion-length", str(a.max_new_tokens), "--beta", str(a.beta), "--temperature", "1.0",
        "--iters", str(iters), "--steps-per-report", "1", "--steps-per-eval", str(10 * iters),
        "--save-every", str(10 * iters), "--adapter-path", str(work / "adapters"), "--learning-rate", "1e-6",
        "--seed", "0",
    ]))
    args = types.SimpleNamespace(**args)
    for k, v in cli.CONFIG_DEFAULTS.items():  # as mlx_lm_lora.train.main fills them
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    args.fuse = False  # no merged model written after training
    if a.lora_rank:  # its own choice of layers in each block (mlx-lm's defaults), every block
        args.lora_parameters = {"rank": a.lora_rank, "dropout": 0.0, "scale": 20.0}

    seconds, tokens = [], []

    class Clock(TrainingCallback):
        def on_train_loss_report(self, info):
            seconds.append(1.0 / info["iterations_per_second"])
            tokens.append(info["train_average_generated_tokens"])
            print(f"anchor: iteration {info['iteration']}: {seconds[-1]:.3f} s, "
                  f"{tokens[-1]:.1f} tokens per completion", file=sys.stderr, flush=True)

    cli.run(args, training_callback=Clock())
    report("mlx-lm-lora", version("mlx-lm-lora"), seconds, a.warmup,
           "one train_grpo iteration: generation, rewards, loss+grad with reference pass, Adam update",
           completion_tokens=tokens, mlx=version("mlx"), mlx_lm=version("mlx-lm"),
           excluded=f"model and reference load, dataset, first {a.warmup} iteration(s)")


if __name__ == "__main__":
    main()
