"""Is the Hugging Face hub there? One metadata call with a short timeout, made before a hub id
(model.path, data.dataset) is handed to mlx-lm or `datasets`.

Their clients wait much longer than this when the hub cannot be reached: `datasets` retries a
lost connection for about 25 s, and mlx-lm's download waited 200 s (until the server went
away) on a hub that accepted the connection and never answered. A metadata call answers in
well under a second when the hub is up; the client tries a timed-out first call once more, so
the check gives up after twice this.
"""

TIMEOUT_S = 3.0


def unreachable(name: str, repo_type: str) -> str | None:
    """Why the hub cannot be asked about `name` (a model or dataset repo id), or None when it
    answered (even "no such repo", which the loader then reports in its own words) or when
    HF_HUB_OFFLINE is set (the loaders then read their caches)."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError

    if constants.HF_HUB_OFFLINE:
        return None
    try:
        HfApi().repo_info(name, repo_type=repo_type, timeout=TIMEOUT_S)
    except HfHubHTTPError:  # it answered: not found, gated, private...
        return None
    except Exception as e:  # the client's connection errors have many types
        return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return None
