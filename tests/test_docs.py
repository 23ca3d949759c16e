"""Every fenced code block of README.md and docs/*.md runs here, or says why it cannot.

A block whose fence has `<!-- needs: WHAT -->` on the line before it is not run (WHAT is one of
NEEDS: the internet, a Mac, minutes of work, an optional extra, a terminal); `<!-- output -->`
marks printed output or a quoted value; `<!-- file: NAME -->` is a file the page has you write,
written there before the block runs or is parsed. Every other block runs, in a scratch folder per page that links to
configs/, data/ and examples/, in the page's order (a later block may use a run an earlier one
made): each `uv run mlx-grpo ...` line goes to `mlx_grpo.cli.main` in-process, cut small
(SMALL below: a training run to one step of two prompts, an eval to four prompts); Python blocks
are executed; TOML and JSON blocks are parsed. A block of any other kind, or a shell line that is
not an mlx-grpo command, fails unless it is marked. And every relative link names a file and a
heading that exist."""

import contextlib
import io
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from mlx_grpo.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NEEDS = {"hub", "net", "mac", "slow", "extra", "interactive"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
MARK = re.compile(r"<!-- (?:needs: (\w+)|(output)|file: (\S+)) -->")
TRAIN_SMALL = ["--set", "training.max_steps=1", "--set", "training.prompts_per_step=2",
               "--set", "generation.max_new_tokens=16"]
SMALL = {"eval": ["--limit", "4"], "generate": ["--max-tokens", "16"], "bench": ["--steps", "1"],
         "sweep": ["--steps", "1"]}


def blocks(page: Path) -> list[dict]:
    """Each fenced block of a page: its line, language, text and marker (None, 'output' or a need)."""
    text, out = page.read_text(), []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1] if text[:m.start()].endswith("\n") else ""
        mark = MARK.fullmatch(before.strip())
        out.append({"line": text.count("\n", 0, m.start()) + 1, "lang": m[1], "body": m[2],
                    "mark": (mark[1] or mark[2]) if mark else None, "file": mark[3] if mark else None})
    return out


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _commands(body: str) -> list[list[str]]:
    """The shell lines of a block, as words, continuations joined and comments dropped."""
    return [words for line in body.replace("\\\n", " ").splitlines() if (words := shlex.split(line, comments=True))]


def _small(argv: list[str]) -> list[str]:
    """A command cut to seconds: what SMALL adds, a training run to one step."""
    if argv[0] == "train" or argv[0].startswith("--config"):
        return argv + TRAIN_SMALL
    if argv[0] == "eval" and "--limit" in argv:
        argv = argv[:argv.index("--limit")] + argv[argv.index("--limit") + 2:]
    return argv + SMALL.get(argv[0], [])


def _run_shell(block: dict, where: str) -> None:
    for words in _commands(block["body"]):
        assert words[:3] == ["uv", "run", "mlx-grpo"], f"{where}: not an mlx-grpo command, mark the block: {words}"
        argv, out_file = words[3:], None
        if ">" in argv:
            argv, out_file = argv[:argv.index(">")], argv[argv.index(">") + 1]
        printed, errors = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
            code = main(_small(argv))
        assert code == 0, f"{where}: `{shlex.join(words)}` exited {code}: {errors.getvalue()[-2000:]}"
        if out_file:
            Path(out_file).write_text(printed.getvalue())


def _run_python(block: dict, where: str) -> None:
    code = re.sub(r'"max_steps": \d+', '"max_steps": 1', block["body"])
    exec(compile(code, where, "exec"), {"__name__": "__docs__"})


def _parse(block: dict, where: str) -> None:
    if block["lang"] == "toml":
        tomllib.loads(block["body"])
    elif "\n{" in block["body"].strip():  # JSON Lines: one object a line
        [json.loads(line) for line in block["body"].splitlines() if line.strip()]
    else:  # one JSON value, on one line or several
        json.loads(block["body"])


RUNNERS = {"bash": _run_shell, "sh": _run_shell, "python": _run_python, "toml": _parse, "json": _parse}


def test_every_block_is_runnable_or_marked():
    problems = []
    for page in PAGES:
        for b in blocks(page):
            where = f"{_name(page)}:{b['line']}"
            if b["mark"] not in (None, "output") and b["mark"] not in NEEDS:
                problems.append(f"{where}: unknown marker needs: {b['mark']} (known: {sorted(NEEDS)})")
            elif b["mark"] is None and b["lang"] not in RUNNERS:
                problems.append(f"{where}: a ```{b['lang']} block the test cannot run: mark it")
    assert not problems, "\n".join(problems)
    assert sum(len(blocks(p)) for p in PAGES) > 40


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_the_pages_blocks_run(page, tmp_path, monkeypatch):
    for folder in ("configs", "data", "examples"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    monkeypatch.chdir(tmp_path)
    ran = 0
    for b in blocks(page):
        if b["mark"] is None and b["lang"] in RUNNERS:
            if b["file"]:  # the block is a file the page has you write; later blocks use it
                Path(b["file"]).write_text(b["body"])
            RUNNERS[b["lang"]](b, f"{_name(page)}:{b['line']}")
            ran += 1
    assert ran, f"{_name(page)} runs no example"


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_names_a_file_and_a_heading_there():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists():
                broken.append(f"{_name(page)}: {target}: no such file")
                continue
            if anchor and path.suffix == ".md":
                headings = {_slug(h) for h in re.findall(r"^#+ (.*)$", FENCE.sub("", path.read_text()), re.M)}
                if anchor not in headings:
                    broken.append(f"{_name(page)}: {target}: no heading '{anchor}' in {path.name}")
    assert not broken, "\n".join(broken)
