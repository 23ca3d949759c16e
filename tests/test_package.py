"""The package as a whole: no dead code."""

import ast
import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).parent.parent


def test_every_public_function_and_class_is_used():
    """Each public top-level function or class of mlx_grpo is used somewhere in the package or
    its scripts, or named in the README or docs/ as public API; tests alone do not count.
    `evaluate_rewards` and `model.count_parameters` were dead and failed this."""
    modules = sorted((REPO / "mlx_grpo").rglob("*.py"))
    texts = [p.read_text() for p in [*modules, *(REPO / "scripts").glob("*.py"), REPO / "README.md", *(REPO / "docs").glob("*.md")]]
    # a name's uses are the words equal to it (what \bname\b matches), counted once for all names
    words = Counter(w for t in texts for w in re.findall(r"\w+", t))
    unused = []
    for path in modules:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                if words[node.name] <= 1:  # its own definition only
                    unused.append(f"{path.stem}.{node.name}")
    assert not unused


def test_folders_the_readme_writes_into_are_git_ignored_and_the_package_is_not():
    import shutil
    import subprocess

    root = Path(__file__).parent.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        import pytest

        pytest.skip("not a git checkout")

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=root).returncode == 0

    assert ignored("models/qwen-4bit/config.json") and ignored("runs/eval/builtin-tiny_test.json")
    assert not ignored("mlx_grpo/models/load.py")  # /models/, anchored: not the package's models/


def _modules() -> dict[str, Path]:
    """mlx_grpo's modules by dotted name."""
    return {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
            for p in sorted((REPO / "mlx_grpo").rglob("*.py"))}


def test_no_module_over_300_lines_and_no_function_over_80():
    long_modules = [f"{name} ({n})" for name, p in _modules().items() if (n := len(p.read_text().splitlines())) > 300]
    long_functions = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := node.end_lineno - node.lineno + 1) > 80:
                    long_functions.append(f"{name}.{node.name} ({n})")
    assert not long_modules and not long_functions, (long_modules, long_functions)


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The mlx_grpo modules `name` imports anywhere in its file (inside functions too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def test_no_import_cycle():
    """No module imports (at the top or inside a function) one that imports it back, however far
    round: convert.py and load.py did."""
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    graph = {k: {v for v in vs if not k.startswith(v + ".")} for k, vs in graph.items()}  # a package's face
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles
