"""`shape:NAME`: a model at the published shape of a real one (shapes_catalog.py), with random
weights and a tokenizer made here, built once into $MLX_GRPO_CACHE like `builtin:small`.

The folder holds config.json (the published values), model.safetensors (mlx-lm's model class
for that config, bfloat16 as published: matrices drawn N(0, 0.02) from MLX's generator with a
fixed seed, norms and other vectors as the class initialises them) and the tokenizer files
(shape_tokenizer.py). It is written aside and renamed into place, so a killed build leaves no
half folder and two processes building it at once both end with the same complete one.
`build_shape(folder, name, shrunk=True)` writes the catalog's shrunk copy, which the tests train.
"""

import copy
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from mlx_grpo.errors import ModelError
from mlx_grpo.models.shapes_catalog import SHAPES, Shape

PREFIX = "shape:"
SEED = 0
INIT_STD = 0.02


def known_shapes() -> str:
    return ", ".join(PREFIX + name for name in SHAPES)


def catalog_entry(name: str, setting: str = "model.path") -> Shape:
    if name not in SHAPES:
        raise ModelError(f"{setting}: unknown model shape {PREFIX}{name}; known: {known_shapes()}")
    return SHAPES[name]


def _merged(base: dict, changes: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def vocab_size(config: dict) -> int:
    return config.get("vocab_size") or config["text_config"]["vocab_size"]


def special_ids(shape: Shape, vocab: int) -> dict[int, int]:
    """Published id -> id in a vocabulary of `vocab`: the same where it fits, else from the top
    of the vocabulary down, in the order of the published ids."""
    high = sorted(i for i in shape.specials if i >= vocab)
    return {i: (i if i < vocab else vocab - len(high) + high.index(i)) for i in shape.specials}


def _remap_token_ids(config: dict, ids: dict[int, int]) -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            value = _remap_token_ids(value, ids)
        elif key.endswith("token_id"):
            value = [ids.get(v, v) for v in value] if isinstance(value, list) else ids.get(value, value)
        out[key] = value
    return out


def shape_config(name: str, shrunk: bool = False, setting: str = "model.path") -> dict:
    """The config.json of shape `name` (or of its shrunk copy, its token ids remapped)."""
    shape = catalog_entry(name, setting)
    if not shrunk:
        return copy.deepcopy(shape.config)
    config = _merged(shape.config, shape.shrunk)
    return _remap_token_ids(config, special_ids(shape, vocab_size(config)))


def shape_model_path(name: str, setting: str = "model.path") -> Path:
    """The cache folder of `shape:NAME`, built on first use."""
    path = shape_folder(name, setting)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        print(f"mlx-grpo: building {PREFIX}{name} (random weights at the shape of {SHAPES[name].source}) "
              f"into {path}", file=sys.stderr)
        build_shape(tmp, name)
        os.rename(tmp, path)
    except OSError:
        if not path.exists():
            raise
        # Another process renamed its build into place first; its folder is as good as ours.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def shape_folder(name: str, setting: str = "model.path") -> Path:
    """Where `shape:NAME` is built: named by its config, seed and the code that builds it."""
    from mlx_grpo.models import builtin, shape_tokenizer, shapes_catalog

    digest = hashlib.sha256(json.dumps([shape_config(name, setting=setting), SEED]).encode())
    for module in (shapes_catalog, shape_tokenizer, sys.modules[__name__]):
        digest.update(Path(module.__file__).read_bytes())
    return builtin.cache_dir() / f"shape-{name}-{digest.hexdigest()[:12]}"


def build_shape(folder: Path, name: str, shrunk: bool = False) -> Path:
    """Write shape `name` (its shrunk copy with `shrunk`) into the existing folder `folder`."""
    from mlx_lm.utils import save_model

    config = write_tokenizer_and_config(folder, name, shrunk)
    save_model(folder, random_model(config, SEED))
    return folder


def write_tokenizer_and_config(folder: Path, name: str, shrunk: bool = False) -> dict:
    """Shape `name`'s tokenizer files and config.json, no weights (what a plan of its data needs);
    returns the config."""
    from mlx_lm.utils import save_config

    from mlx_grpo.models.shape_tokenizer import write_tokenizer

    shape, config = SHAPES[name], shape_config(name, shrunk)
    vocab = vocab_size(config)
    ids = special_ids(shape, vocab)
    write_tokenizer(folder, vocab, {ids[i]: t for i, t in shape.specials.items()}, shape.eos, shape.pad, shape.chat)
    save_config(copy.deepcopy(config), folder / "config.json")
    return config


def random_model(config: dict, seed: int):
    """mlx-lm's model for `config` with random bfloat16 weights (see the module docstring)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    from mlx_grpo.planner.shapes import lazy_model
    from mlx_grpo.rng import capture_rng, restore_rng

    rng = capture_rng()  # the classes draw their own initial values; ours come from `seed`
    try:
        mx.random.seed(seed)
        model = lazy_model(config)
        params = tree_flatten(model.parameters())
        keys = mx.random.split(mx.random.key(seed), len(params))
        weights = []
        for key, (path, value) in zip(keys, params):
            if value.ndim >= 2:
                value = mx.random.normal(value.shape, dtype=mx.bfloat16, scale=INIT_STD, key=key)
            weights.append((path, value.astype(mx.bfloat16)))
        model.update(tree_unflatten(weights))
        mx.eval(model.parameters())
    finally:
        restore_rng(rng)
    return model
