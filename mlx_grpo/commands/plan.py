"""`mlx-grpo plan`: will this profile fit in this machine's memory? The predicted peak of each
phase (planner/: config.json and safetensors headers, no weights loaded) against the
device's memory, and, when it does not fit, single changes that would. `train` runs the same
check (`check_fits`) before it loads anything; a `shape:NAME` not built yet is planned from its
config alone, so one too large for the machine is refused before any of its weights is made.
"""

import contextlib
from dataclasses import replace
import io
import json
import os
import sys
from pathlib import Path

from mlx_grpo.config import load_config
from mlx_grpo.errors import UserError
from mlx_grpo.planner.constants import GB
from mlx_grpo.planner.links import LINKS, format_scaling
from mlx_grpo.planner.predict import predict, suggestions
from mlx_grpo.planner.shapes import (JudgeShape, config_model_shape, lazy_model, read_config, read_model_shape, run_shape,
                                     trainable_params)

PHASES = ("weights", "adapters", "optimizer state", "reference", "rollout copy", "rollout KV cache", "update activations",
          "logits", "judge weights", "judge KV cache", "rollout", "update", "judging")  # judge ones: with a judge


class MemoryPlanError(UserError):
    pass


class PlanUnavailable(MemoryPlanError):
    """The model's shapes cannot be read without downloading it."""


def device_memory_gb() -> float:
    """MLX's own figure on Metal (its recommended working set, else the memory size); system RAM
    on the CPU backend."""
    import mlx.core as mx

    if mx.metal.is_available():
        info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        size = info.get("max_recommended_working_set_size") or info.get("memory_size")
        if size:
            return size / GB
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB


def model_folder(path: str, setting: str = "model.path") -> Path:
    """The local folder holding the model's config.json and safetensors: a built-in, a local
    folder, or a hub id already in the Hugging Face cache (nothing is downloaded)."""
    from mlx_grpo.models.load import resolve_model_path

    from mlx_grpo.config.paths import is_local_path

    local = Path(resolve_model_path(path)).expanduser()
    if local.is_dir():
        return local
    if is_local_path(path):  # a path, never a hub id: the loader's own line
        raise MemoryPlanError(f"{setting}: folder {path!r} does not exist")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, local_files_only=True,
                                      allow_patterns=["config.json", "model*.safetensors*"]))
    except Exception as e:  # not cached (or not a repo id): the plan cannot read the shapes
        raise PlanUnavailable(f"{setting}: {path} is neither a local folder nor in the Hugging Face cache "
                              f"({type(e).__name__}); download it first to plan its memory") from e


def planned_model(path: str):
    """(ModelShape, local folder or None, config.json object) of model.path. A `shape:NAME` not
    built yet has no folder: it is planned from its catalog config, and nothing is built."""
    from mlx_grpo.models.load import check_model_folder
    from mlx_grpo.models.shapes import PREFIX, shape_config, shape_folder

    name = path.removeprefix(PREFIX)
    if path.startswith(PREFIX) and not shape_folder(name).exists():
        config = shape_config(name)
        return config_model_shape(config), None, config
    folder = model_folder(path)
    check_model_folder(str(folder), tokenizer=False)  # a folder the loader refuses: its one line, here too
    return read_model_shape(folder), folder, read_config(folder)


def shares_prefix(config: dict) -> bool:
    """Whether this model's layers keep only caches ours stand in for (models/caches.py: plain and
    sliding-window attention): training.shared_prefix applies to it (algorithm/prefix.py) and the
    compiled loop decodes it (rollout/engine.py). A config whose model mlx-lm cannot build here is
    assumed to."""
    from mlx_grpo.models.caches import other_cache_kinds

    try:
        model = lazy_model(config)
    except Exception:  # an architecture this mlx-lm lacks: loading will say so
        return True
    return not other_cache_kinds(model)


def compiles_rollouts(cfg) -> bool:
    """Whether a model whose layers keep plain KV caches samples with the compiled loop: as
    commands/setup.rollout_engine and rollout/sample.generate_completions decide it (tool episodes
    decode with BatchGenerator)."""
    from mlx_grpo.tools import uses_tools

    gen = cfg.generation
    if gen.engine == "batch_generator" or uses_tools(cfg) or gen.batch_size % gen.num_generations:
        return False
    return gen.engine == "compiled" or not gen.quantize_bits


def longest_prompt(cfg, folder: Path | None) -> int | None:
    """The longest training prompt, in tokens, that data.max_prompt_tokens lets through (longer
    ones are skipped); None when the data cannot be read without a download. A `shape:NAME` not
    built yet (`folder` None) gets its tokenizer written aside for this."""
    import tempfile

    from mlx_lm.utils import load_tokenizer

    from mlx_grpo.data.examples import load_examples
    from mlx_grpo.models.shapes import PREFIX, write_tokenizer_and_config

    try:
        with tempfile.TemporaryDirectory() as tmp:
            if folder is None:
                folder = Path(tmp)
                write_tokenizer_and_config(folder, cfg.model.path.removeprefix(PREFIX))
            tokenizer = load_tokenizer(folder)
        with contextlib.redirect_stdout(io.StringIO()):  # "data: skipped N prompts ..." is train's to say
            examples = load_examples(cfg.data, tokenizer, seed=cfg.seed)
    except UserError as e:  # hub data that cannot be reached: the worst case stands alone
        print(f"mlx-grpo: plan: no peak for the data itself ({e})", file=sys.stderr)
        return None
    return max(len(e.prompt_tokens) for e in examples)


def judge_shapes(cfg) -> tuple[JudgeShape, ...]:
    """Each judge reward's model and requests, by formula: a request holds its template's
    characters (each counted as a token, an upper bound), the longest prompt and one completion
    (in group mode G of them) at their caps, and the judge's answer; data fields it names are
    not counted. A single judge answers every completion of a step, a group judge each prompt."""
    from mlx_grpo.judge.reward import TEMPLATES

    t, gen, out = cfg.training, cfg.generation, []
    for i, r in enumerate(cfg.rewards):
        if r.name != "judge":
            continue
        shape = read_model_shape(model_folder(r.model, f"rewards[{i}].model"), f"rewards[{i}].model")
        group = r.mode == "group"
        requests = t.prompts_per_step * t.gradient_accumulation_steps * (1 if group else gen.num_generations)
        answer = 0 if r.parse == "yes_no" else r.max_new_tokens  # yes/no reads the next token alone
        tokens = (len(r.template or TEMPLATES[(r.mode, r.parse)]) + cfg.data.max_prompt_tokens
                  + (gen.num_generations if group else 1) * gen.max_new_tokens + answer)
        out.append(JudgeShape(shape, min(r.batch_size, requests), tokens))
    return tuple(out)


def plan(cfg, memory_gb: float | None = None, data: bool = False) -> dict:
    """The prediction: bytes of every phase in GB, `peak_gb`, `device_gb`, `fits`, and
    `suggestions` ([--set items, predicted peak GB], when it does not fit). With `data`, also
    `data_peak_gb`: the peak at the training split's own longest prompt (`data_prompt_tokens`),
    which a run on that data reaches when a completion runs to max_new_tokens."""
    from mlx_grpo.models.load import resolve_dtype

    shape, folder, config = planned_model(cfg.model.path)
    run = replace(run_shape(cfg, resolve_dtype(cfg.model.dtype)), judges=judge_shapes(cfg))
    plain_caches = shares_prefix(config)
    if run.shared_prefix and not plain_caches:  # it trains on the padded path (setup.py)
        run = replace(run, shared_prefix=False)
    run = replace(run, compiled_rollout=plain_caches and compiles_rollouts(cfg))
    phases = predict(shape, run)
    device = memory_gb if memory_gb is not None else device_memory_gb()
    fits = phases["peak"] <= device * GB
    result = {
        "model": cfg.model.path, "phases_gb": {k: phases[k] / GB for k in PHASES if k in phases},
        "peak_gb": phases["peak"] / GB, "device_gb": device, "fits": fits,
        "suggestions": [] if fits else [[s, p / GB] for s, p in suggestions(shape, run, device * GB)],
        "trainable_params": trainable_params(shape, run),
    }
    if data and (longest := longest_prompt(cfg, folder)) is not None:
        result["data_prompt_tokens"] = longest
        result["data_peak_gb"] = predict(shape, replace(run, max_prompt=longest))["peak"] / GB
    return result


def check_fits(cfg, memory_gb: float | None = None) -> dict:
    """`plan`, raising a one-line MemoryPlanError with the best suggestion when it does not fit."""
    result = plan(cfg, memory_gb)
    if not result["fits"]:
        best = result["suggestions"][0] if result["suggestions"] else None
        hint = (f"try --set {best[0].replace(' ', ' --set ')} (predicted {best[1]:.2f} GB)" if best
                else "no single change in `mlx-grpo plan` makes it fit")
        raise MemoryPlanError(
            f"predicted peak memory {result['peak_gb']:.2f} GB > {result['device_gb']:.2f} GB on this device; "
            f"{hint}; --ignore-memory trains anyway")
    return result


def check_memory(cfg, memory_gb: float | None) -> None:
    """Refuse, before any weight loads, a profile whose predicted peak memory exceeds the device's;
    a model whose shapes cannot be read without a download is not checked."""
    try:
        check_fits(cfg, memory_gb)
    except PlanUnavailable as e:
        print(f"mlx-grpo: memory not checked: {e}", file=sys.stderr)


def worst_case_wanted(cfg) -> bool:
    """training.worst_case_first; "auto" is on when the predicted peak is above half the device's
    memory, or when it cannot be predicted. Below that the probe is skipped: on the smoke
    profile it costs more than its worth (docs/memory.md, "Worst case first")."""
    mode = cfg.training.worst_case_first
    if mode != "auto":
        return mode == "always"
    try:
        result = plan(cfg)
    except MemoryPlanError:
        return True
    return result["peak_gb"] > result["device_gb"] / 2


def memory_first(cfg, tr, world) -> None:
    """Before step 1: set MLX's buffer cache (`limit_cache`), then, when wanted, the worst-case
    update (update/worst_case.py), which stops a run that cannot hold its longest samples now."""
    import time

    import mlx.core as mx

    from mlx_grpo.update.worst_case import (
        batch_shape, limit_cache, worst_case_rollout, worst_case_rows, worst_case_update,
    )

    limit_cache(device_memory_gb() * GB)
    # every rank or none: the probe's passes reduce over the ranks, whose Macs may differ
    if not world.max(float(worst_case_wanted(cfg))):
        return
    tic = time.perf_counter()
    mx.reset_peak_memory()
    sequences, tokens = worst_case_rollout(tr.model, cfg, world)
    rollout_gb, rollout_s = mx.get_peak_memory() / GB, time.perf_counter() - tic
    probe = worst_case_update(tr.model, tr.ref_model, tr.grad_fn, tr.settings, cfg, world)
    if world.is_main:
        print(f"mlx-grpo: worst case first: the rollout's KV cache at {sequences} sequences x {tokens} tokens "
              f"peaked at {rollout_gb:.2f} GB in {rollout_s:.1f} s; one update at the longest shapes "
              f"({batch_shape(cfg, worst_case_rows(cfg, world))}) at {probe['peak_gb']:.2f} GB "
              f"in {probe['seconds']:.1f} s")


def format_plan(result: dict) -> list[str]:
    lines = [f"memory plan for {result['model']} (GB):"]
    for name, gb in result["phases_gb"].items():
        lines.append(f"  {name:<20} {gb:10.3f}")
    verdict = "fits" if result["fits"] else "does not fit"
    lines.append(f"  {'peak':<20} {result['peak_gb']:10.3f}   device {result['device_gb']:.2f} GB: {verdict}")
    if "data_peak_gb" in result:
        lines.append(f"  {'peak on this data':<20} {result['data_peak_gb']:10.3f}   its longest prompt, "
                     f"{result['data_prompt_tokens']} tokens, with completions up to max_new_tokens")
    if not result["fits"]:
        if result["suggestions"]:
            lines.append("changes that fit, each alone (--set):")
            lines += [f"  {s:<45} peak {p:.3f} GB" for s, p in result["suggestions"]]
        else:
            lines.append("no single change fits; combine them, or use a smaller model")
    return lines


def add_arguments(parser):
    parser.add_argument("--config", required=True, help="TOML profile, e.g. configs/default.toml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key with a TOML value (repeatable)")
    parser.add_argument("--memory-gb", type=float, default=None, metavar="N",
                        help="plan for N GB instead of this device's memory")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the prediction as JSON")
    parser.add_argument("--ranks", type=int, default=0, metavar="N",
                        help="also predict the step time and scaling efficiency on 1 to N Macs (needs --link "
                             "and --step-seconds; planner/links.py)")
    parser.add_argument("--link", choices=list(LINKS), default=None, help="the link between the Macs, for --ranks")
    parser.add_argument("--step-seconds", type=float, default=None, metavar="S",
                        help="the one-Mac step time, for --ranks: metrics.jsonl's step_time or `mlx-grpo bench`")


def main(args) -> int:
    """Exit code 0 when the profile fits, 1 when it does not."""
    cfg = load_config(args.config, args.overrides)
    if args.ranks and (args.link is None or not args.step_seconds or args.step_seconds <= 0):
        raise UserError("--ranks needs --link (one of " + ", ".join(LINKS) + ") and --step-seconds S > 0, the "
                        "one-Mac step time (metrics.jsonl's step_time, or `mlx-grpo bench`)")
    result = plan(cfg, args.memory_gb, data=True)
    print("\n".join(format_plan(result)))
    if args.ranks:
        nbytes = result["trainable_params"] * (2 if cfg.distributed.reduce_dtype == "bfloat16" else 4)
        print("\n".join(format_scaling(args.step_seconds, nbytes, cfg.grpo.num_iterations, args.link, args.ranks)))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["fits"] else 1
