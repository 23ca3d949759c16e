"""Whether a setting's value (model.path, data.dataset) names a local path or a hub id.

A hub id is `name` or `owner/name`. A value is local when it starts with `.`, `~` or `/`, holds
a backslash or more than one slash, exists on disk, or is `folder/name` with `folder` a folder
here (`models/x`): such a value that does not exist is reported as a missing path, not looked up
on the hub, where it would fail later with a network error that does not say what was meant.
"""

from pathlib import Path


def is_local_path(value: str) -> bool:
    path = Path(value).expanduser()
    if value.startswith((".", "~", "/")) or "\\" in value or value.count("/") > 1 or path.exists():
        return True
    return "/" in value and path.parent.is_dir()
