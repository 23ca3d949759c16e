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
from collections.abc import Sequence
from dataclasses import MISSING
from pathlib import Path
from typing import Any

import tomli_w

from mlx_grpo.errors import UserError, naming
from mlx_grpo.config.rules import RETIRED, RULES, SEED_LIMIT
from mlx_grpo.config.sections import JUDGE_DEFAULTS, Config, RewardConfig


class ConfigError(UserError, ValueError):
    """A bad profile or override. The message is always one line."""

    def __init__(self, message: str):
        super().__init__(message.replace("\n", "\\n"))


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


def _merge(obj: Any, table: dict[str, Any], prefix: str, source: str, saved: bool = False) -> None:
    """Set each entry of a TOML table on a dataclass, checking name, type and range; a retired
    key stops with its replacement, or is skipped in a run's saved config."""
    hints = typing.get_type_hints(type(obj))
    for key, value in table.items():
        dotted = _dotted(prefix, key)
        if dotted in RETIRED:
            if saved:
                continue
            raise ConfigError(f"{source}: {dotted} is retired; use {RETIRED[dotted]}")
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
            _merge(getattr(obj, key), value, dotted, source, saved)
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
                keywords: dict[str, Any] | None = None, saved: bool = False) -> Config:
    """Defaults <- the profile <- `section.key=value` overrides <- keyword overrides.

    The profile is a TOML file's path, a dict of the same shape, a Config, or None (defaults
    only). `keywords` are the Python API's overrides: a top-level key with its value
    (`seed=1`) or a section with a dict (`training={"max_steps": 3}`), checked as `--set` is.
    saved: the profile is a run's own config.toml, whose retired keys are skipped (`RETIRED`).
    """
    cfg = Config()
    if isinstance(profile, Config):
        _merge(cfg, config_to_dict(profile), "", "config")
    elif isinstance(profile, dict):
        _merge(cfg, profile, "", "config")
    elif isinstance(profile, (str, os.PathLike)):
        _merge(cfg, _read_profile(profile), "", str(profile), saved)
    elif profile is not None:  # never open(int): that is a file descriptor, closed after reading
        raise ConfigError(f"profile: expected a TOML file's path, a dict or a Config, got "
                          f"{type(profile).__name__} {profile!r:.60}")
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
    if cfg.grpo.importance_sampling_floor >= cfg.grpo.importance_sampling_cap:
        raise ConfigError(
            f"grpo.importance_sampling_floor must be < grpo.importance_sampling_cap "
            f"({cfg.grpo.importance_sampling_cap}), got {cfg.grpo.importance_sampling_floor}"
        )
    if cfg.generation.quantize_bits and cfg.model.quantize_bits:
        raise ConfigError(
            f"generation.quantize_bits = {cfg.generation.quantize_bits} needs a float policy, but "
            f"model.quantize_bits = {cfg.model.quantize_bits} (QLoRA): its rollouts already run on quantized weights"
        )
    for i, reward in enumerate(cfg.rewards):
        _check_judge_keys(reward, f"rewards[{i}]")
    g, cap = cfg.grpo, cfg.generation.max_new_tokens
    if g.overlong_penalty > 0 and g.overlong_buffer > cap:
        raise ConfigError(
            f"grpo.overlong_buffer must be <= generation.max_new_tokens ({cap}) when "
            f"grpo.overlong_penalty > 0, got {g.overlong_buffer}"
        )
    return cfg


def _check_judge_keys(reward: RewardConfig, where: str) -> None:
    """The judge needs a model and gets the defaults of the keys it leaves out; the judge's keys
    on any other reward are a mistake, not something to ignore."""
    if reward.name != "judge":
        given = [k for k in ("model", *JUDGE_DEFAULTS) if getattr(reward, k) is not None]
        if given:
            raise ConfigError(f"{where}.{given[0]}: only the judge reward (name = \"judge\") takes {given[0]}, "
                              f"not {reward.name!r}")
        return
    if not (reward.model or "").strip():
        raise ConfigError(f"{where}.model: the judge reward needs a model (hub id, local folder or builtin:NAME)")
    for key, default in JUDGE_DEFAULTS.items():
        if getattr(reward, key) is None:
            setattr(reward, key, default)
    if reward.mode == "group" and reward.parse != "number":
        raise ConfigError(f"{where}.parse: mode = \"group\" reads a ranking (parse = \"number\"), not {reward.parse!r}")


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain TOML-serializable data; keys whose value is None are left out."""
    return dataclasses.asdict(cfg, dict_factory=lambda kv: {k: v for k, v in kv if v is not None})


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Write `cfg` as TOML; `load_config(path)` gives back an equal Config."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with naming(path):  # a full disk: the error names config.toml, and no .tmp stays behind
            tmp.write_text(tomli_w.dumps(config_to_dict(cfg)), encoding="utf-8")
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)  # whole or not at all: a full disk never leaves a 0-byte config.toml
