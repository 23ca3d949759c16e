"""Which of mlx-lm's per-layer caches our own attention caches stand in for.

The compiled decode loop (rollout/engine.py) and shared-prefix scoring (algorithm/prefix.py) keep a
layer's keys and values themselves. They stand in for a plain KVCache, and for a sliding window's
RotatingKVCache (Gemma 3, gpt-oss, Olmo 3 ...) by keeping every key, in order, and masking all but
the last `max_size` of them: the keys the rotating buffer would still hold, the ones its query
sees. A rotating cache that also keeps first tokens (`keep`), convolution or SSM state (hybrids'
ArraysCache) and other kinds are not stood in for.
"""

from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache


def _stands_in(cache) -> bool:
    return type(cache) is KVCache or (type(cache) is RotatingKVCache and cache.keep == 0)


def other_cache_kinds(model) -> list[str]:
    """The names of the cache kinds of `model`'s layers that are neither of the two."""
    return sorted({type(c).__name__ for c in make_prompt_cache(model) if not _stands_in(c)})


def layer_windows(model) -> list:
    """Each layer's window: its RotatingKVCache's max_size, or None for a plain KVCache."""
    return [c.max_size if type(c) is RotatingKVCache else None for c in make_prompt_cache(model)]


def window_of(asked, kept):
    """The keys a query sees: the window the model asks its mask for, within those its cache keeps."""
    windows = [w for w in (asked, kept) if w is not None]
    return min(windows) if windows else None


def within_window(rows, cols, window):
    """Which keys (columns `cols`) queries at columns `rows` see: those at or before them, and with
    `window` set, the last `window` of those (broadcast arrays of column indices)."""
    mask = rows >= cols
    return mask if window is None else mask & (rows - cols < window)
