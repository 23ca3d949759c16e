"""The three random streams a run draws from (MLX, NumPy, Python): seeding, saving, restoring."""

import random

import mlx.core as mx
import numpy as np


def seed_everything(seed: int) -> None:
    mx.random.seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def capture_rng() -> dict:
    """The MLX, NumPy and Python PRNG states as JSON-ready data."""
    key = mx.random.state[0]
    mx.eval(key)
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "mlx": key.tolist(),
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
        "python": [version, list(internal), gauss_next],
    }


def restore_rng(state: dict) -> None:
    # An MLX key [hi, lo] is exactly the key that seed (hi << 32 | lo) makes.
    hi, lo = state["mlx"]
    mx.random.seed((hi << 32) | lo)
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
