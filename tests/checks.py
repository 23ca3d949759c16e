"""Assertions several test files share."""


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
