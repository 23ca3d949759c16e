"""Scoring a model on held-out prompts: the profile's rewards and the task's own metric.

Every configured reward is averaged over greedy completions, under the names training logs
(`reward`, `rewards/<name>/mean`). The task metric follows from the data and the rewards:
- GSM8K-style references (every answer ends in `#### N`, or is a number): `accuracy`, the share of greedy
  answers whose number is right (pass@1) as the correctness reward reads it (the last number
  in the last <answer> tag, else the last number anywhere); beside it `accuracy_format` (right
  and in the expected format: an <answer> tag holding just the number, or `#### N`), and
  lm-evaluation-harness's GSM8K scoring, `accuracy_strict` (its strict-match: the first
  `#### N`) and `accuracy_lenient` (its flexible-extract: the last number-like run), each
  compared as its exact_match compares strings; with K > 1 samples per prompt also `maj@K` (the
  most frequent sampled number is right) and `pass@K` (any sampled number is right), the
  samples drawn at eval.temperature with generation's top_p, top_k and min_p;
- a ROUGE reward among the rewards: `rouge1`, `rouge2`, `rougeL`, mean F-measures of the
  greedy completions against the references (rouge-score, stemmed).
`accuracy_stderr`, `reward_stderr`: standard errors over the n prompts (std / sqrt(n)).
Identical rows (the same prompt and fields) are scored once, so a cycled split does not count twice.
`mlx-grpo eval` writes the results JSON into the run folder, or under runs/eval/ for a model
that is not a run, and never replaces an earlier file unless told to (`output_path`).
"""

from dataclasses import dataclass
import json
from pathlib import Path
import re

import mlx.core as mx
import numpy as np
from tqdm import tqdm

from mlx_grpo.commands.args import add_model_args, add_progress_arg, number_at_least, seed_number
from mlx_grpo.errors import UserError
from mlx_grpo.data.examples import check_token_ids, load_examples
from mlx_grpo.models.vocab import embedding_rows
from mlx_grpo.rewards.task_metrics import accuracy_metrics, is_gsm8k_style, number_metrics, rouge_metrics
from mlx_grpo.rng import capture_rng, restore_rng
from mlx_grpo.run.console import cap_width, show_bar
from mlx_grpo.run.guard import check_replaceable
from mlx_grpo.run.layout import CONFIG
from mlx_grpo.rollout.sample import generate_completions, make_rollout_sampler
from mlx_grpo.rollout.score import reward_batch


@dataclass
class EvalSettings:
    """How one evaluation decodes: `[eval]` with command-line flags applied on top."""

    num_samples: int = 1
    temperature: float = 1.0  # of the K samples; their truncation is generation's (below)
    max_new_tokens: int = 128
    batch_size: int = 16
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    @classmethod
    def from_config(cls, cfg, **flags) -> "EvalSettings":
        e, gen = cfg.eval, cfg.generation
        values = {
            "num_samples": e.num_samples, "temperature": e.temperature, "batch_size": e.batch_size,
            "max_new_tokens": e.max_new_tokens or gen.max_new_tokens,
            "top_p": gen.top_p, "top_k": gen.top_k, "min_p": gen.min_p,
        }
        values.update({k: v for k, v in flags.items() if v is not None})
        return cls(**values)


def load_eval_examples(cfg, tokenizer, split: str, limit: int = 0, setting: str = "eval.split",
                       model=None, model_name: str = ""):
    """The split's distinct prompts, in order, the first `limit` of them (0 = all).

    A split the data set does not have stops with one line naming `setting` (the key or flag
    that chose it) and the splits there are; with the `model`, so does a prompt token it cannot
    embed, naming the row and `model_name` (default: model.path).
    """
    seen, out = set(), []
    for e in load_examples(cfg.data, tokenizer, seed=cfg.seed, split=split, setting=setting):
        key = (e.prompt, json.dumps(e.columns, sort_keys=True, default=str))  # fields may be lists, tables
        if key not in seen:
            seen.add(key)
            out.append(e)
    out = out[:limit] if limit else out
    if model is not None and (rows := embedding_rows(model)) is not None:
        check_token_ids(out, rows, model_name or f"model.path: {cfg.model.path}", split)
    return out


def _decode(model, tokenizer, examples, k: int, sampler, settings, bar) -> list[list[str]]:
    """k completions per example, decoded batch_size prompts at a time; one list per example."""
    texts = []
    for lo in range(0, len(examples), settings.batch_size):
        chunk = examples[lo:lo + settings.batch_size]
        rollout = generate_completions(
            model, tokenizer, [e.prompt_tokens for e in chunk], num_generations=k,
            max_new_tokens=settings.max_new_tokens, sampler=sampler,
        )
        texts += [rollout.texts[i * k:(i + 1) * k] for i in range(len(chunk))]
        bar.update(len(chunk))
    return texts


def evaluate(model, tokenizer, examples, reward_set, settings: EvalSettings, progress: bool = True) -> dict:
    """{"metrics": {...}, "samples": [...]} for the examples (see the module docstring)."""
    model.eval()
    k = settings.num_samples
    total = len(examples) * (2 if k > 1 else 1)
    bar = tqdm(total=total, desc="eval", unit="prompt", disable=not show_bar(progress), dynamic_ncols=True)
    with cap_width(bar):
        greedy = [t[0] for t in _decode(model, tokenizer, examples, 1, make_rollout_sampler(0.0, 1.0, 0, 0.0),
                                        settings, bar)]
        sampled = None
        if k > 1:
            sampler = make_rollout_sampler(settings.temperature, settings.top_p, settings.top_k, settings.min_p)
            sampled = _decode(model, tokenizer, examples, k, sampler, settings, bar)
    batch = reward_batch(examples, greedy, 1)
    questions, answers = batch.prompts, batch.answers
    totals, per_name = reward_set.score(batch)
    metrics = {"num_prompts": len(examples)}
    if is_gsm8k_style(answers):
        metrics.update(accuracy_metrics(greedy, answers))
        p = metrics["accuracy"]  # the binomial standard error, over the distinct prompts
        metrics["accuracy_stderr"] = float(np.sqrt(p * (1 - p) / len(examples)))
        if sampled is not None:
            metrics.update(number_metrics(sampled, answers))
    if any("rouge" in name for name in per_name):
        metrics.update(rouge_metrics(greedy, answers))
    metrics["reward"] = float(np.mean(totals))
    metrics["reward_stderr"] = float(np.std(totals) / np.sqrt(len(totals)))
    for name, scores in per_name.items():  # None (not scored) is left out, as in training
        given = [v for v in scores if v is not None]
        metrics[f"rewards/{name}/mean"] = float(np.mean(given)) if given else None
    lengths = [len(tokenizer.encode(t, add_special_tokens=False)) for t in greedy]
    metrics["completions/mean_length"] = float(np.mean(lengths))
    samples = [
        {"question": q, "answer": a, "completion": c, "rewards": {n: v[i] for n, v in per_name.items()},
         **({"samples": sampled[i]} if sampled is not None else {})}
        for i, (q, a, c) in enumerate(zip(questions, answers, greedy))
    ]
    return {"metrics": metrics, "samples": samples}


def format_table(metrics: dict) -> str:
    """Two aligned columns, metric and value."""
    width = max(len(k) for k in metrics)
    rows = [f"{'metric':<{width}}  value", f"{'-' * width}  -----"]
    for key, value in metrics.items():
        rows.append(f"{key:<{width}}  {value:.4f}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    return "\n".join(rows)


def make_training_eval(cfg, tokenizer, reward_set, model=None):
    """For `[eval] every = N`: a function (model) -> {"eval/<metric>": value}, or None when off.

    The examples are loaded now, so a bad split stops the run before its first step. The K
    samples draw from the random streams, which are put back as they were afterwards: what
    training samples next does not depend on whether or how it evaluates.
    """
    if not cfg.eval.every:
        return None
    examples = load_eval_examples(cfg, tokenizer, cfg.eval.split, cfg.eval.limit, model=model)
    settings = EvalSettings.from_config(cfg)

    def run(model) -> dict:
        streams = capture_rng()
        result = evaluate(model, tokenizer, examples, reward_set, settings, progress=False)
        reward_set.take_timing()  # the eval's reward time is not the next step's
        restore_rng(streams)
        return {f"eval/{k}": v for k, v in result["metrics"].items()}  # printed after the step's line

    return run


def _eval_config(args, loaded):
    """The profile given with --config, else the config of the run that M came from."""
    from mlx_grpo.config import load_config
    from mlx_grpo.errors import ModelError

    if args.config:
        return load_config(args.config, args.overrides)
    if loaded is not None and loaded.config is not None:
        return load_config(loaded.checkpoint / CONFIG, args.overrides, saved=True)
    raise ModelError("eval: give --config FILE (the profile whose data and rewards to use), "
                     "or a --model that comes from a run")


EVAL_DIR = Path("runs") / "eval"  # where results of models that are not runs go (runs/ is git-ignored)


def default_output(loaded, split: str, model_name: str) -> Path:
    """<run>/eval_<split>_<checkpoint>.json for a run's checkpoint, else runs/eval/<model>_<split>.json."""
    if loaded is not None and loaded.run_dir is not None:
        return loaded.run_dir / f"eval_{split}_{loaded.checkpoint.name}.json"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name.strip("/.~")).strip("-") or "model"
    return EVAL_DIR / f"{slug}_{split}.json"


def output_path(out: str | None, loaded, split: str, model_name: str, overwrite: bool) -> Path:
    """Where the results go. An existing default file is kept and the next free numbered name
    (`..._2.json`) used; an existing --out file is refused. --overwrite replaces either."""
    if out:
        path = Path(out).expanduser()
        check_replaceable(path, "--out", [("the model folder", loaded.checkpoint if loaded else None)])
        if path.is_dir():  # --overwrite replaces a file, never a folder
            raise UserError(f"--out {out}: is a folder; give a file, e.g. --out {Path(out) / 'eval.json'}")
        if path.exists() and not overwrite:
            raise UserError(f"--out {out}: file exists; pass --overwrite to replace it")
        return path
    path = default_output(loaded, split, model_name)
    n = 2
    while path.exists() and not overwrite:
        path = path.with_name(f"{default_output(loaded, split, model_name).stem}_{n}.json")
        n += 1
    return path


def add_arguments(parser):
    parser.add_argument("--config", default=None, help="profile (default: the config of the run M comes from)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key with a TOML value, e.g. --set eval.limit=50 (repeatable)")
    add_model_args(parser, required=False)
    parser.add_argument("--split", default=None, help="default: eval.split")
    parser.add_argument("--limit", type=number_at_least(0), default=None,
                        help="first N distinct prompts (default: eval.limit)")
    parser.add_argument("--num-samples", type=number_at_least(1), default=None, metavar="K",
                        help="K > 1 adds maj@K and pass@K")
    parser.add_argument("--temperature", type=number_at_least(0.0, float), default=None,
                        help="for the K samples (default: eval.temperature)")
    parser.add_argument("--max-tokens", type=number_at_least(1), default=None, help="default: eval.max_new_tokens")
    parser.add_argument("--seed", type=seed_number, default=None, help="default: the config's seed")
    parser.add_argument("--out", "--json", dest="out", default=None, metavar="FILE",
                        help="results JSON (default: <run>/eval_<split>_<checkpoint>.json for a run, else "
                        "runs/eval/<model>_<split>.json; an existing default file gets a numbered name)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing results file")
    add_progress_arg(parser)


def main(args) -> dict:
    from mlx_grpo.commands.setup import make_rewards
    from mlx_grpo.models.load import load_base
    from mlx_grpo.models.named import load_model

    loaded = load_model(args.model, args.adapter) if args.model else None
    cfg = _eval_config(args, loaded)
    if loaded is None:  # the configured base, loaded as setup.build_policy loads it before adapters
        model, tokenizer, _ = load_base(cfg.model)
    else:
        model, tokenizer = loaded.model, loaded.tokenizer
    split = args.split or cfg.eval.split
    model_name = args.model or cfg.model.path
    out = output_path(args.out, loaded, split, model_name, args.overwrite)  # before the slow part
    limit = cfg.eval.limit if args.limit is None else args.limit
    settings = EvalSettings.from_config(cfg, num_samples=args.num_samples, max_new_tokens=args.max_tokens,
                                        temperature=args.temperature)
    reward_set = make_rewards(cfg, args.config, group_size=1)
    examples = load_eval_examples(cfg, tokenizer, split, limit, setting="--split" if args.split else "eval.split",
                                  model=model, model_name=f"--model {args.model}" if args.model else "")
    mx.random.seed(cfg.seed if args.seed is None else args.seed)
    result = evaluate(model, tokenizer, examples, reward_set, settings, progress=args.progress)
    result = {"model": model_name, "adapter": args.adapter, "split": split,
              "num_samples": settings.num_samples, "max_new_tokens": settings.max_new_tokens, **result}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result["metrics"]))
    print(f"mlx-grpo: wrote {out}")
    return result
