"""Finding and loading the model a user names with `--model M` (generate, chat, eval, export).

M is one of, tried in this order:
- a run folder (it has `checkpoints/`): its newest intact checkpoint (a damaged newer one is
  skipped with a warning naming it);
- an adapter checkpoint (`adapter_config.json`): the base named by its `config.toml` (loaded
  as the run loaded it: same dtype, same quantization), with the adapters on top;
- a model folder (`config.json`): a full checkpoint, an exported or a converted folder;
- a hub id, `builtin:NAME` (a built-in model gets the system prompt it was warm-started with) or
  `shape:NAME` (models/shapes.py).
`--adapter DIR` adds an adapter folder to a base M. The run's resolved `config.toml`, when the
checkpoint, the adapter or the exported folder has one, supplies the system prompt.
"""

from dataclasses import dataclass
from pathlib import Path
import sys

import mlx_lm
from mlx_lm.tuner.utils import load_adapters

from mlx_grpo.config import Config, load_config
from mlx_grpo.config.paths import is_local_path
from mlx_grpo.errors import ModelError
from mlx_grpo.models.load import hub_or_cache, load_base, resolve_model_path
from mlx_grpo.data.chat import DEFAULT_SYSTEM_PROMPT
from mlx_grpo.run.checkpoint import checkpoint_damage, newest_intact
from mlx_grpo.run.layout import (
    ADAPTER_CONFIG, CHECKPOINTS, CONFIG, MANIFEST, MODEL_CONFIG, latest_checkpoint, run_dir_of,
)


@dataclass
class LoadedModel:
    model: object
    tokenizer: object
    base_path: str  # local folder of the weights (of the base, under an adapter)
    config: Config | None  # the resolved config of the run it came from, if known
    checkpoint: Path | None  # the checkpoint or model folder, when M was local
    run_dir: Path | None  # the run folder holding that checkpoint, if any
    trained_system_prompt: str = ""  # what a model without a run config was trained with

    @property
    def system_prompt(self) -> str:
        return self.config.data.system_prompt if self.config is not None else self.trained_system_prompt

    @property
    def template_kwargs(self) -> dict:
        """The run's data.chat_template_kwargs, which its prompts were rendered with."""
        return self.config.data.chat_template_kwargs if self.config is not None else {}


def _run_config(folder: Path) -> Config | None:
    path = folder / CONFIG
    return load_config(path, saved=True) if path.is_file() else None


def _is_run(path: Path) -> bool:
    return (path / CHECKPOINTS).is_dir() and not (path / MODEL_CONFIG).exists()


def _newest_checkpoint(spec: str, run: Path, flag: str) -> Path:
    """A run folder's newest intact checkpoint; each damaged newer one is named in a warning."""
    ckpt, damaged = newest_intact(run)
    if ckpt is None:
        if damaged:
            raise ModelError(f"{flag} {spec}: run folder {run} has no intact checkpoint ({'; '.join(damaged)})")
        raise ModelError(f"{flag} {spec}: run folder {run} has no complete checkpoint yet")
    if damaged:
        print(f"mlx-grpo: warning: damaged checkpoint(s) skipped: {'; '.join(damaged)}; using {ckpt.name}",
              file=sys.stderr)
    return ckpt


_ATTEMPTS = 3  # a run checkpoints far less often than a model loads


def _load_run(spec: str, run: Path, flag: str) -> LoadedModel:
    """The newest intact checkpoint of a run folder, loaded. A run training there writes new
    checkpoints and prunes old ones meanwhile, which may remove the one being read: when a newer
    checkpoint has appeared since, the newest is read again instead of reporting the removal."""
    for attempt in range(_ATTEMPTS):
        newest = latest_checkpoint(run)
        try:
            return _load_folder(spec, _newest_checkpoint(spec, run, flag), flag, verified=True)
        except ModelError:
            if attempt == _ATTEMPTS - 1 or latest_checkpoint(run) == newest:
                raise


def _load_folder(spec: str, ckpt: Path, flag: str, verified: bool = False) -> LoadedModel:
    """A checkpoint, adapter or model folder (`verified`: its manifest was checked)."""
    if not verified and (ckpt / MANIFEST).is_file() and (problem := checkpoint_damage(ckpt)):
        raise ModelError(f"{flag} {spec}: checkpoint {ckpt} is damaged: {problem}")
    cfg = _run_config(ckpt)
    if (ckpt / ADAPTER_CONFIG).is_file():
        if cfg is None:
            raise ModelError(
                f"{flag} {spec}: adapter folder {ckpt} has no {CONFIG} naming its base; "
                "give the base as --model and this folder as --adapter"
            )
        model, tokenizer, base_path = load_base(cfg.model)
        _loading(f"{flag} {spec}", ckpt, load_adapters, model, str(ckpt))
    elif (ckpt / MODEL_CONFIG).is_file():
        model, tokenizer = _loading(f"{flag} {spec}", ckpt, mlx_lm.load, str(ckpt))
        base_path = str(ckpt)
    else:
        raise ModelError(
            f"{flag} {spec}: {ckpt} is not a model folder (no config.json, "
            "adapter_config.json or checkpoints/)"
        )
    model.eval()
    return LoadedModel(model, tokenizer, base_path, cfg, ckpt, run_dir_of(ckpt))


def _loading(given: str, folder: Path, load, *args):
    """load(*args), with a folder's damaged or mismatched files reported as one line opening with
    `given` (the flag and the value the user typed)."""
    try:
        return load(*args)
    except (OSError, RuntimeError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{given}: cannot load {folder} ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:300]})") from e


def _load_named(spec: str, flag: str) -> LoadedModel:
    """A hub id, builtin:NAME or shape:NAME."""
    path = resolve_model_path(spec, flag)
    hub = not Path(path).exists()
    if hub:  # one line at once when the hub cannot be reached
        path = hub_or_cache(path, flag)
    try:
        model, tokenizer = mlx_lm.load(path)
    except Exception as e:  # the hub client's errors have many types; say which model failed
        where = " from the hub" if hub else ""
        raise ModelError(f"{flag}: cannot load {spec!r}{where} ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:300]})") from e
    local = path if Path(path).exists() else str(mlx_lm.utils.hf_repo_to_path(path))
    # The built-in models are warm-started on chats that open with the default system prompt.
    system = DEFAULT_SYSTEM_PROMPT if spec.startswith("builtin:") else ""
    return LoadedModel(model, tokenizer, local, None, None, None, system)


def load_model(spec: str, adapter: str | None = None, flag: str = "--model") -> LoadedModel:
    """Load M (see the module docstring), plus an adapter folder when one is given. `flag` is
    how the user gave M (`--model`, or export's SOURCE), which every error names."""
    path = Path(spec).expanduser()
    if path.is_dir():
        loaded = _load_run(spec, path, flag) if _is_run(path) else _load_folder(spec, path, flag)
    elif path.exists():
        raise ModelError(f"{flag} {spec}: is a file, not a model or run folder")
    elif is_local_path(spec):
        raise ModelError(f"{flag} {spec}: no such folder")
    else:
        loaded = _load_named(spec, flag)
    if adapter:
        _add_adapter(loaded, spec, Path(adapter).expanduser(), flag)
    return loaded


def _add_adapter(loaded: LoadedModel, spec: str, adapter: Path, flag: str):
    if not (adapter / ADAPTER_CONFIG).is_file():
        raise ModelError(f"--adapter {adapter}: not an adapter folder (no adapter_config.json)")
    if loaded.checkpoint is not None and (loaded.checkpoint / ADAPTER_CONFIG).is_file():
        raise ModelError(f"{flag} {spec} already carries an adapter; give its base with --adapter")
    _loading(f"--adapter {adapter}", adapter, load_adapters, loaded.model, str(adapter))
    loaded.model.eval()
    loaded.config = _run_config(adapter) or loaded.config
    loaded.checkpoint, loaded.run_dir = adapter, run_dir_of(adapter)
