"""Every script under scripts/ answers --help with its usage and does nothing else."""

from pathlib import Path
import subprocess
import sys

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in (ROOT / "scripts").rglob("*.py") if 'if __name__ == "__main__"' in p.read_text())


def test_every_script_parses_help_without_running():
    assert len(SCRIPTS) >= 10
    runs = {p: subprocess.Popen([sys.executable, str(p), "--help"], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for p in SCRIPTS}
    for path, proc in runs.items():  # started together: on 2 cores the imports overlap
        out, err = proc.communicate(timeout=120)
        name = path.relative_to(ROOT)
        assert proc.returncode == 0 and "Traceback" not in err, f"{name}: {err[-500:]}"
        assert out.startswith("usage:"), f"{name}: {out[:200]}"


def test_validate_memory_plan_parses_its_arguments():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import validate_memory_plan as v
    finally:
        sys.path.pop(0)
    assert v.parse_args([]).models == ["tiny", "small"]
    assert v.parse_args(["tiny", "--save", "x.json"]).save == "x.json"
