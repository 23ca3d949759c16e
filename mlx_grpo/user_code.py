"""The user's own Python named in a profile: 'package.module:name' or 'path/to/file.py:name'.

Rewards and tools are both given this way. A file is tried against the profile's folder first,
then the working directory, and loaded once per resolved path under a name registered in
sys.modules, so dataclasses and pickle inside it work and a file that holds both a reward and a
tool (examples/calculator_tools.py) is one module with one state, as `import` would make it.
Failures raise the caller's error class with `label` in front, in one line.
"""

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

MODULE_PREFIX = "_mlx_grpo_user_"


def describe(e: BaseException) -> str:
    """An exception as one line: its type and its message with whitespace folded."""
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


def is_file_target(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def load_module(target: str, base_dir, label: str, error: type[Exception]):
    """The module a target names: a .py file (relative to base_dir, then the cwd) or an importable name."""
    if not is_file_target(target):
        try:
            return importlib.import_module(target)
        except (Exception, SystemExit) as e:
            raise error(f"{label}: cannot import module {target!r}: {describe(e)}") from e
    path = Path(target).expanduser()
    roots = [] if path.is_absolute() else [d for d in (base_dir, Path.cwd()) if d is not None]
    candidates = [Path(d) / path for d in roots] or [path]
    found = next((p.resolve() for p in candidates if p.is_file()), None)
    if found is None:
        raise error(f"{label}: file not found (looked at {', '.join(map(str, candidates))})")
    name = f"{MODULE_PREFIX}{found.stem}_{hashlib.sha1(str(found).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, found)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # sys.exit() in a user's file must not end the run silently
        del sys.modules[name]
        raise error(f"{label}: loading {found} failed: {describe(e)}") from e
    return module
