"""--force and --overwrite never delete what the command reads or a training run (run/guard.py)."""

from pathlib import Path
import shutil

import pytest

from checks import one_line_error
from mlx_grpo.cli import main
from mlx_grpo.run.guard import ReplaceError, check_replaceable


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def run(lora_run, tmp_path):
    """A copy of the shared two-step LoRA run, so a failing guard cannot damage the fixture."""
    copy = tmp_path / "run"
    shutil.copytree(lora_run, copy)
    return copy


@pytest.mark.parametrize("out", ["run", "run/checkpoints/step_000001", "run/checkpoints", "run/metrics.jsonl"])
def test_export_refuses_the_source_and_its_parts_and_deletes_nothing(run, out, capsys):
    before = _files(run)
    target = run.parent / out
    assert main(["export", str(run), "--out", str(target), "--force"]) == 2
    one_line_error(capsys, f"--out {target}")
    assert _files(run) == before


def test_export_refuses_a_folder_holding_another_run_or_the_source(run, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(run, other)
    before = _files(other)
    assert main(["export", str(run), "--out", str(other), "--force"]) == 2
    one_line_error(capsys, "holds a training run")
    assert _files(other) == before

    ckpt = run / "checkpoints" / "step_000002"
    before = _files(run)
    assert main(["export", str(ckpt), "--out", str(run), "--force"]) == 2  # holds the checkpoint it reads
    one_line_error(capsys, "holds the source")
    assert _files(run) == before


def test_export_refuses_a_folder_with_a_run_inside_it_and_deletes_nothing(run, tmp_path, capsys):
    """`export run --out archive --force` deleted archive/old_run, a whole training run, without a word."""
    archive = tmp_path / "archive"
    shutil.copytree(run, archive / "old_run")
    before = _files(archive)
    assert main(["export", str(run), "--out", str(archive), "--force"]) == 2
    one_line_error(capsys, f"--out {archive}: holds a training run in {archive / 'old_run'}")
    assert _files(archive) == before


def test_export_again_onto_its_own_earlier_export_with_force(run, tmp_path, capsys):
    """An export holds the run's config.toml: the second `--force` onto it was refused as 'holds a
    training run (config.toml)', though an export is what --force replaces."""
    out = tmp_path / "fused"
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert (out / "config.toml").is_file()
    assert main(["export", str(run), "--out", str(out), "--force"]) == 0, capsys.readouterr().err
    assert (out / "config.json").is_file()


def test_export_force_refuses_a_folder_that_holds_no_model_and_deletes_nothing(run, tmp_path, capsys):
    """`--out ~ --force` (a typo, a folder of notes) must not delete what is there: --force replaces
    an earlier model folder only."""
    home = tmp_path / "home"
    (home / "notes").mkdir(parents=True)
    for name in ("a.txt", "b.txt", "c.txt", "d.txt"):
        (home / name).write_text(name)
    before = _files(home)
    assert main(["export", str(run), "--out", str(home), "--force"]) == 2
    one_line_error(capsys, f"--out {home}: holds no model (no config.json; it holds a.txt, b.txt, c.txt, ...); "
                           "--force replaces only a model folder; choose another folder")
    assert _files(home) == before


def test_export_to_a_fresh_folder_beside_the_run_still_works(run, tmp_path, capsys):
    assert main(["export", str(run), "--out", str(tmp_path / "fused")]) == 0
    assert (tmp_path / "fused" / "config.json").is_file()


def test_convert_refuses_its_own_source(tiny_path, tmp_path, capsys):
    src = tmp_path / "model"
    shutil.copytree(tiny_path, src)
    before = _files(src)
    assert main(["convert", "--hf-path", str(src), "--mlx-path", str(src), "--force"]) == 2
    one_line_error(capsys, "--mlx-path", "is the --hf-path")
    assert main(["convert", "--hf-path", str(src), "--mlx-path", str(src / "inner"), "--force"]) == 2
    one_line_error(capsys, "lies inside the --hf-path")
    assert _files(src) == before


def test_train_overwrite_refuses_to_delete_the_adapter_it_starts_from(run, capsys):
    before = _files(run)
    adapter = run / "checkpoints" / "step_000002"
    code = main(["train", "--config", "configs/smoke_test.toml", "--overwrite", "--ignore-memory",
                 "--set", f'output_dir="{run}"', "--set", "lora.enabled=true", "--set", "lora.rank=4",
                 "--set", f'lora.resume_adapter="{adapter}"'])
    assert code == 2
    one_line_error(capsys, "--overwrite", "holds lora.resume_adapter")
    assert _files(run) == before


def test_eval_refuses_to_overwrite_a_run_file(run, capsys):
    metrics = run / "metrics.jsonl"
    before = metrics.read_bytes()
    assert main(["eval", "--model", str(run), "--out", str(metrics), "--overwrite", "--limit", "2"]) == 2
    one_line_error(capsys, "is part of the training run")
    assert metrics.read_bytes() == before


def test_the_guard_checks_the_base_model_and_skips_hub_ids(tmp_path):
    base = tmp_path / "models" / "qwen"
    base.mkdir(parents=True)
    with pytest.raises(ReplaceError, match="is the base model"):
        check_replaceable(base, "--out", [("the base model", str(base))])
    with pytest.raises(ReplaceError, match="holds the base model"):
        check_replaceable(tmp_path / "models", "--out", [("the base model", str(base))])
    check_replaceable(tmp_path / "fresh", "--out", [("the source", "Qwen/Qwen2.5-0.5B-Instruct")])
