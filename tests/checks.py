"""Assertions and helpers several test files share."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def import_from(folder: str, name: str):
    """A module of the repository's scripts/ or examples/ (not a package), imported by name."""
    sys.path.insert(0, str(ROOT / folder))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def one_line_error(capsys, *needles):
    """The command printed exactly one `mlx-grpo: error:` line, holding every needle, and no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("mlx-grpo: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def unwrap(text: str) -> list[str]:
    """Console lines with their continuations (lines the console indents by 4 spaces) joined back on."""
    lines = []
    for line in text.splitlines():
        if line.startswith("    ") and lines:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines
