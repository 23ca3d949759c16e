"""The built-in models `builtin:tiny` and `builtin:small`, the same bytes on every machine.

`builtin:tiny` ships inside the package (`mlx_grpo/builtin/tiny/`): a warm-started ~1M
parameter Qwen2 with a tokenizer trained on the arithmetic chats, checked against the
SHA-256 sums of its manifest.json before first use. It is never trained on the user's
machine: the same recipe gives a different model on another BLAS or backend
(`mlx_grpo/models/tiny_recipe.py` and `scripts/build_tiny.py` rebuild it for maintainers).

`builtin:small` (~25M parameters, for speed benchmarks) is random: its weights are drawn with
NumPy's PCG64 from a fixed seed, which gives the same bytes everywhere, and written once into
$MLX_GRPO_CACHE (default ~/.cache/mlx-grpo) with tiny's tokenizer. The folder is built aside and
renamed into place, so a killed build leaves no half folder and concurrent builders agree.
"""

import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from mlx_grpo.errors import ModelError
from mlx_grpo.rng import capture_rng, restore_rng

SHIPPED = Path(__file__).parent.parent / "builtin"  # the data folder stays at mlx_grpo/builtin/
MANIFEST = "manifest.json"
SMALL_ARCH = {
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 1536,
}
SMALL_SEED = 0
KNOWN = ("tiny", "tiny-tools", "small")


def cache_dir() -> Path:
    return Path(os.environ.get("MLX_GRPO_CACHE", "~/.cache/mlx-grpo")).expanduser()


def builtin_model_path(name: str) -> Path:
    """The local folder of built-in model `name`: the shipped tiny, or small built once."""
    if name == "tiny":
        return verified(SHIPPED / "tiny")
    if name == "tiny-tools":  # tiny warm-started to call a calculator (scripts/build_tiny_tools.py)
        return verified(SHIPPED / "tiny_tools")
    if name == "small":
        return _small_path()
    raise ModelError(f"model.path: unknown built-in model {name!r}; known: {', '.join(KNOWN)}")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(folder: Path) -> None:
    """manifest.json: the size and SHA-256 of every other file in `folder`."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST)
    entries = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    (folder / MANIFEST).write_text(json.dumps({"files": entries}, indent=1) + "\n")


@functools.cache
def verified(folder: Path) -> Path:
    """`folder` once each file matches its manifest entry; else a one-line ModelError."""
    try:
        entries = json.loads((folder / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"{folder / MANIFEST}: missing or unreadable ({e}); reinstall mlx-grpo") from e
    for name, entry in entries.items():
        path = folder / name
        if not path.is_file():
            raise ModelError(f"{path}: missing (listed in {MANIFEST}); reinstall mlx-grpo")
        if _sha256(path) != entry["sha256"]:
            raise ModelError(f"{path}: SHA-256 differs from {MANIFEST} (the file is damaged or was "
                             "changed); reinstall mlx-grpo")
    return folder


def _small_recipe() -> dict:
    tiny = json.loads((verified(SHIPPED / "tiny") / "config.json").read_text())
    keep = ("model_type", "rms_norm_eps", "rope_theta", "max_position_embeddings", "tie_word_embeddings",
            "torch_dtype", "vocab_size", "eos_token_id", "pad_token_id")
    return {**{k: tiny[k] for k in keep}, **SMALL_ARCH}


def _small_path() -> Path:
    config = _small_recipe()
    digest = hashlib.sha256(json.dumps([config, SMALL_SEED]).encode())
    digest.update(Path(__file__).read_bytes())
    path = cache_dir() / f"small-{digest.hexdigest()[:12]}"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    rng = capture_rng()  # MLX draws while it initialises the layers that are then replaced
    try:
        _build_small(tmp, config)
        os.rename(tmp, path)
        print(f"mlx-grpo: wrote builtin:small to {path}", file=sys.stderr)
    except OSError:
        if not path.exists():
            raise
        # Another process renamed its build into place first; its folder is as good as ours.
    finally:
        restore_rng(rng)
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _build_small(path: Path, config: dict) -> None:
    from mlx_lm.models import qwen2
    from mlx_lm.utils import save_config, save_model

    for f in SHIPPED.joinpath("tiny").iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, path / f.name)
    save_config(dict(config), path / "config.json")
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))
    model.update(tree_unflatten(random_weights(model, SMALL_SEED)))
    mx.eval(model.parameters())
    save_model(path, model)


def random_weights(model, seed: int) -> list[tuple[str, mx.array]]:
    """Fresh float32 weights for every parameter of `model`, from NumPy's PCG64 only.

    MLX's own initialisers draw through its random kernels, whose float rounding is the
    backend's; uniform doubles from PCG64 cast to float32 are the same bits everywhere.
    Norm scales are 1; a matrix's entries are uniform with bound 1/sqrt(fan_in) (MLX's
    Linear default), the embedding's with standard deviation 1/sqrt(dims) (MLX's Embedding).
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    out = []
    for name, p in sorted(tree_flatten(model.parameters())):
        if "norm" in name:
            values = np.ones(p.shape)
        else:
            fan_in = p.shape[-1]
            bound = (3 / fan_in) ** 0.5 if "embed" in name else fan_in ** -0.5
            values = (rng.random(p.shape) * 2 - 1) * bound
        out.append((name, mx.array(values.astype(np.float32))))
    return out
