"""Loading and saving the typed config: the values each field allows, and `load_config`, which layers
defaults <- profile file <- `--set section.key=value` overrides. Each value is checked
for name, type and range where it enters, so a `ConfigError` names its source (the file
or the `--set` item), the dotted key, what was expected and what was found, on one line.
`save_config` writes the resolved config as TOML that loads back equal. Stdlib only
(tomllib, difflib) plus tomli_w for writing; no MLX.
"""

import dataclasses
import difflib
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import MISSING
from pathlib import Path
from typing import Any

import tomli_w

from mlx_grpo.errors import UserError
from mlx_grpo.config.sections import Config


class ConfigError(UserError, ValueError):
    """A bad profile or override. The message is always one line."""

    def __init__(self, message: str):
        super().__init__(message.replace("\n", "\\n"))


# What each field allows beyond its type: dotted key -> (check, what the message says).
Rule = tuple[Callable[[Any], bool], str]


def _at_least(lo: float) -> Rule:
    return (lambda v: v >= lo), f">= {lo}"


def _above(lo: float) -> Rule:
    return (lambda v: v > lo), f"> {lo}"


def _within(lo: int, hi: int, why: str = "") -> Rule:
    return (lambda v: lo <= v <= hi), f"in [{lo}, {hi}]" + (f" ({why})" if why else "")


# Sizes past these hold more than any Mac's memory (a 128K-token context is the largest a
# supported model has; 1024 completions of a prompt or 4096 prompts a step are far past the
# largest runs in the literature), so a typo (an extra zero or two) is caught at load, not
# as an allocation failure minutes into the run.
MAX_TOKENS, MAX_SEQUENCES = 131072, 4096


def _one_of(*allowed: object) -> Rule:
    return (lambda v: v in allowed), "one of " + ", ".join(map(repr, allowed))


_UNIT: Rule = (lambda v: 0 <= v < 1), "in [0, 1)"

_NON_EMPTY: Rule = (lambda v: bool(v.strip())), "a non-empty string"

_DATASET: Rule = (
    (lambda v: bool(v.strip()) if isinstance(v, str) else bool(v) and all(k.strip() and f.strip() for k, f in v.items())),
    "a non-empty string (hub id, file or builtin:NAME) or a non-empty table of split names to files",
)

# NumPy's legacy seeding (np.random.seed) takes [0, 2**32); MLX and Python take more.
SEED_LIMIT = 2**32

RULES: dict[str, Rule] = {
    "seed": ((lambda v: 0 <= v < SEED_LIMIT), "in [0, 2**32)"),
    "output_dir": _NON_EMPTY,
    "model.path": _NON_EMPTY,
    "data.dataset": _DATASET,
    "data.split": _NON_EMPTY,
    "data.prompt_field": _NON_EMPTY,
    "model.dtype": _one_of("auto", "float32", "float16", "bfloat16"),
    "model.quantize_bits": _one_of(0, 4, 8),
    "model.quantize_group_size": _one_of(32, 64, 128),
    "lora.rank": _within(1, MAX_SEQUENCES),
    "lora.alpha": _above(0),
    "lora.dropout": _UNIT,
    "lora.target_modules": (bool, "a non-empty array of module names"),
    "lora.num_layers": ((lambda v: v == -1 or v >= 1), "-1 (all layers) or >= 1"),
    "lora.method": _one_of("lora", "dora"),
    "data.max_prompt_tokens": _within(1, MAX_TOKENS),
    "generation.num_generations": (
        (lambda v: 2 <= v <= 1024),
        "in [2, 1024] (G must be at least 2 because advantages are relative within a group)",
    ),
    "generation.max_new_tokens": _within(1, MAX_TOKENS),
    "generation.temperature": _above(0),
    "generation.top_p": ((lambda v: 0 < v <= 1), "in (0, 1]"),
    "generation.top_k": _at_least(0),
    "generation.min_p": _UNIT,
    "generation.batch_size": _within(0, MAX_SEQUENCES),
    "grpo.beta": _at_least(0),
    "grpo.epsilon": _above(0),
    "grpo.epsilon_high": _above(0),
    "grpo.loss_type": _one_of("grpo", "bnpo", "dr_grpo", "dapo"),
    "grpo.scale_rewards": _one_of("group", "batch", "none"),
    "grpo.num_iterations": _at_least(1),
    "grpo.importance_sampling_level": _one_of("token", "sequence"),
    "grpo.top_entropy_quantile": ((lambda v: 0 < v <= 1), "in (0, 1]"),
    "grpo.max_resample_rounds": _at_least(0),
    "grpo.overlong_penalty": _at_least(0),
    "grpo.overlong_buffer": _at_least(1),
    "rewards": (bool, "a non-empty array (at least one reward)"),
    "rewards.name": (bool, "a non-empty reward name"),
    "training.max_steps": _at_least(1),
    "training.prompts_per_step": _within(1, MAX_SEQUENCES),
    "training.gradient_accumulation_steps": _at_least(1),
    "training.micro_batch_size": _within(0, MAX_SEQUENCES),
    "training.learning_rate": _above(0),
    "training.lr_schedule": _one_of("linear", "cosine", "constant"),
    "training.warmup_steps": (
        (lambda v: 0 <= v < 1 or v == int(v)), "a whole number of updates, or a share in [0, 1)"
    ),
    "training.weight_decay": _at_least(0),
    "training.adam_betas": (
        (lambda v: len(v) == 2 and all(0 <= b < 1 for b in v)), "two values, each in [0, 1)"
    ),
    "training.max_grad_norm": _at_least(0),
    "training.max_bad_steps": _at_least(0),
    "logging.log_every": _at_least(1),
    "logging.log_completions": _at_least(0),
    "logging.warn_zero_std_frac": _UNIT,
    "logging.warn_zero_std_steps": _at_least(0),
    "logging.warn_grad_norm_factor": ((lambda v: v == 0 or v > 1), "0 (off) or > 1"),
    "logging.warn_clipped_ratio": ((lambda v: 0 <= v < 1), "in [0, 1) (0 = off)"),
    "logging.warn_kl": _at_least(0),
    "logging.warn_reward_falling_steps": ((lambda v: v == 0 or v >= 3), "0 (off) or >= 3"),
    "checkpoint.save_every": _at_least(1),
    "checkpoint.keep_last": _at_least(1),
    "eval.every": _at_least(0),
    "eval.split": (bool, "a non-empty split name"),
    "eval.limit": _at_least(0),
    "eval.num_samples": _within(1, 1024),
    "eval.temperature": _above(0),
    "eval.max_new_tokens": _within(0, MAX_TOKENS),
    "eval.batch_size": _within(1, MAX_SEQUENCES),
}

_KINDS = {bool: "boolean", int: "integer", float: "float", str: "string",
          list: "array", dict: "table"}
_EXPECTED = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _mismatch(source: str, key: str, expected: str, value: Any) -> ConfigError:
    kind = _KINDS.get(type(value), type(value).__name__)
    return ConfigError(f"{source}: {key} must be {expected}, got {kind} {_show(value)}")


def _dotted(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _unknown(source: str, prefix: str, key: str, known: list[str], what: str) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)  # on bare names: the shared prefix misleads
    hint = f"did you mean {_dotted(prefix, close[0])!r}?" if close else "known: " + ", ".join(known)
    return ConfigError(f"{source}: unknown {what} {_dotted(prefix, key)!r} ({hint})")


def _merge(obj: Any, table: dict[str, Any], prefix: str, source: str) -> None:
    """Set each entry of a TOML table on a dataclass, checking name, type and range."""
    hints = typing.get_type_hints(type(obj))
    for key, value in table.items():
        dotted = _dotted(prefix, key)
        if key not in hints:
            what = "section" if not prefix and isinstance(value, dict) else "key"
            owners = [] if prefix else [s for s, h in hints.items() if dataclasses.is_dataclass(h)
                                        and key in typing.get_type_hints(h)]
            if owners:  # a section's key given bare, e.g. max_steps=3
                guesses = " or ".join(f"'{owner}.{key}'" for owner in owners)
                raise ConfigError(f"{source}: unknown key {key!r} (did you mean {guesses}?)")
            raise _unknown(source, prefix, key, list(hints), what)
        hint = hints[key]
        if dataclasses.is_dataclass(hint):  # a section: merge into it, key by key
            if not isinstance(value, dict):
                raise _mismatch(source, dotted, "a table", value)
            _merge(getattr(obj, key), value, dotted, source)
            continue
        value = _coerce(value, hint, dotted, source)
        check, expected = RULES.get(re.sub(r"\[\d+\]", "", dotted), (None, ""))
        if check is not None and not check(value):
            raise ConfigError(f"{source}: {dotted} must be {expected}, got {_show(value)}")
        setattr(obj, key, value)


def _expected(hint: Any) -> str:
    origin = typing.get_origin(hint)
    return {list: "an array", dict: "a table"}.get(origin) or _EXPECTED[hint]


def _coerce(value: Any, hint: Any, key: str, source: str) -> Any:
    """Return value as type `hint`: int -> float is allowed, nothing else is converted."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # TOML has no null: `X | None` is X
        members = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        # `str | dict[str, str]`: the member of the value's TOML type
        fits = [m for m in members if type(value) is (typing.get_origin(m) or m)
                or (m is float and type(value) is int)]
        if not fits:
            raise _mismatch(source, key, " or ".join(map(_expected, members)), value)
        hint = fits[0]
    if typing.get_origin(hint) is dict:
        if not isinstance(value, dict):
            raise _mismatch(source, key, "a table", value)
        _, elem = typing.get_args(hint)
        return {k: _coerce(v, elem, f"{key}.{k}", source) for k, v in value.items()}
    if typing.get_origin(hint) is list:
        if not isinstance(value, list):
            raise _mismatch(source, key, "an array", value)
        (elem,) = typing.get_args(hint)
        return [_coerce(v, elem, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(hint):  # an element of an array of tables, e.g. rewards[0]
        if not isinstance(value, dict):
            raise _mismatch(source, key, "a table", value)
        required = [f.name for f in dataclasses.fields(hint)
                    if f.default is MISSING and f.default_factory is MISSING]
        for name in required:
            if name not in value:
                raise ConfigError(f"{source}: {key}.{name} is required, found no value")
        obj = hint(**dict.fromkeys(required))
        _merge(obj, value, key, source)
        return obj
    if hint is float and type(value) in (int, float):
        if not math.isfinite(value):
            raise _mismatch(source, key, "a finite number", value)
        return float(value)
    if type(value) is not hint:  # `type(...) is` so that a bool is never taken as an int
        raise _mismatch(source, key, _EXPECTED[hint], value)
    return value


def _read_profile(path: str | os.PathLike) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8").removeprefix("\ufeff")  # editors on Windows write a BOM
        return tomllib.loads(text)
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: profile file not found") from e
    except OSError as e:
        raise ConfigError(f"{path}: cannot read profile file ({e.strerror})") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from e


def _parse_override(item: str) -> dict[str, Any]:
    """`section.key=value` -> {"section": {"key": value}}, the value in TOML syntax."""
    source = f"--set {item}"
    key, sep, text = (part.strip() for part in item.partition("="))
    parts = key.split(".")
    if not sep or not all(parts):
        raise ConfigError(f"{source}: expected section.key=value, e.g. training.max_steps=20")
    try:
        parsed = tomllib.loads("v = " + text)
    except tomllib.TOMLDecodeError as e:
        if any(c in text for c in "\"'[]{}"):
            raise ConfigError(f"{source}: value {text!r} is not valid TOML ({e})") from e
        parsed = {"v": text}  # a bare word, e.g. grpo.loss_type=dr_grpo
    if list(parsed) != ["v"]:
        raise ConfigError(f"{source}: value {text!r} is more than one TOML value")
    value = parsed["v"]
    for part in reversed(parts):
        value = {part: value}
    return value


def load_config(profile: str | os.PathLike | dict | Config | None, overrides: Sequence[str] = (),
                keywords: dict[str, Any] | None = None) -> Config:
    """Defaults <- the profile <- `section.key=value` overrides <- keyword overrides.

    The profile is a TOML file's path, a dict of the same shape, a Config, or None (defaults
    only). `keywords` are the Python API's overrides: a top-level key with its value
    (`seed=1`) or a section with a dict (`training={"max_steps": 3}`), checked as `--set` is.
    """
    cfg = Config()
    if isinstance(profile, Config):
        _merge(cfg, config_to_dict(profile), "", "config")
    elif isinstance(profile, dict):
        _merge(cfg, profile, "", "config")
    elif profile is not None:
        _merge(cfg, _read_profile(profile), "", str(profile))
    for item in overrides:
        _merge(cfg, _parse_override(item), "", f"--set {item}")
    for key, value in (keywords or {}).items():
        _merge(cfg, {key: value}, "", f"mlx_grpo.train({key}=...)")
    if cfg.grpo.epsilon_high is None:
        cfg.grpo.epsilon_high = cfg.grpo.epsilon
    if cfg.lora.resume_adapter and not cfg.lora.enabled:
        raise ConfigError(
            f"lora.resume_adapter is {cfg.lora.resume_adapter!r} but lora.enabled is false; "
            "set lora.enabled = true to train that adapter further"
        )
    g, cap = cfg.grpo, cfg.generation.max_new_tokens
    if g.overlong_penalty > 0 and g.overlong_buffer > cap:
        raise ConfigError(
            f"grpo.overlong_buffer must be <= generation.max_new_tokens ({cap}) when "
            f"grpo.overlong_penalty > 0, got {g.overlong_buffer}"
        )
    return cfg


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain TOML-serializable data; keys whose value is None are left out."""
    return dataclasses.asdict(cfg, dict_factory=lambda kv: {k: v for k, v in kv if v is not None})


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Write `cfg` as TOML; `load_config(path)` gives back an equal Config."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(tomli_w.dumps(config_to_dict(cfg)), encoding="utf-8")
    os.replace(tmp, path)  # whole or not at all: a full disk never leaves a 0-byte config.toml
