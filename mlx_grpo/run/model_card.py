"""The README.md model card in every checkpoint, as mlx-lm's and TRL's saves write one.

It names the base (as mlx-lm can load it: a hub id or a local path, never `builtin:`), the
command that started the run and the one that repeats it, how to use the folder with mlx-lm,
the step's metrics and the resolved config.
"""

from pathlib import Path
import shlex
import sys

from mlx_grpo.run.layout import CONFIG

CARD = "README.md"
_METRICS = ("reward", "reward_std", "loss", "kl", "completions/mean_length")


def loadable_base(model_path: str) -> str:
    """A base mlx-lm can resolve: a hub id as given, a local folder as an absolute path."""
    from mlx_grpo.models.load import resolve_model_path

    path = resolve_model_path(model_path)  # builtin:NAME -> its local folder
    local = Path(path).expanduser()
    return str(local.resolve()) if local.exists() else path


def _started_with() -> str:
    return shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else "(unknown)"


def _metric_lines(row: dict | None) -> list[str]:
    if not row:
        return ["(no metrics logged for this step)"]
    keys = [k for k in _METRICS if k in row]
    keys += sorted(k for k in row if k.startswith(("rewards/", "eval/")) and k.endswith(("/mean", "accuracy")))
    keys += sorted(k for k in row if k.startswith("eval/") and k not in keys)
    lines = ["| metric | value |", "|---|---|"]
    for k in keys:
        value = row[k]
        lines.append(f"| `{k}` | {value:.4g} |" if isinstance(value, float) else f"| `{k}` | {value} |")
    return lines


def model_card(cfg, step: int, base: str, adapter: bool, metrics: dict | None, config_text: str) -> str:
    """The card's Markdown (with Hugging Face's YAML front matter)."""
    use = (f"python -m mlx_lm generate --model {shlex.quote(base)} --adapter-path CHECKPOINT "
           f"--system-prompt {shlex.quote(cfg.data.system_prompt)} --prompt \"...\""
           if adapter else 'python -m mlx_lm generate --model CHECKPOINT --prompt "..."')
    kind = f"{'DoRA' if getattr(cfg.lora, 'method', 'lora') == 'dora' else 'LoRA'} adapter" if adapter else "full fine-tune"
    return "\n".join([
        "---",
        "library_name: mlx",
        f"base_model: {base}",
        "tags: [mlx, grpo, mlx-grpo]",
        "---",
        "",
        f"# {Path(str(cfg.output_dir)).name}, step {step}",
        "",
        f"A {kind} of `{base}` trained with GRPO by mlx-grpo on `{cfg.data.dataset}`.",
        "",
        f"- base model: `{base}` (configured as `{cfg.model.path}`)",
        f"- started with: `{_started_with()}`",
        f"- to repeat: `mlx-grpo train --config CHECKPOINT/{CONFIG}`",
        "",
        "## Use",
        "",
        "```bash",
        use,
        "```",
        "",
        "## Metrics at this step",
        "",
        *_metric_lines(metrics),
        "",
        f"## Config ({CONFIG})",
        "",
        "```toml",
        config_text.rstrip(),
        "```",
        "",
    ])


def write_model_card(folder, cfg, step: int, metrics: dict | None) -> None:
    folder = Path(folder)
    base = loadable_base(cfg.model.path)
    text = model_card(cfg, step, base, cfg.lora.enabled, metrics, (folder / CONFIG).read_text())
    (folder / CARD).write_text(text)
