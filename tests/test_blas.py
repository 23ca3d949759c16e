"""The start-up warning for Linux without OpenBLAS: told from the libraries mapped into the
process (not from LD_PRELOAD), printed once by train and bench, never where OpenBLAS is mapped
or on macOS."""

import os
import platform
from pathlib import Path

import pytest

from mlx_grpo import cli
from mlx_grpo.run import blas
from mlx_grpo.run.blas import reference_blas

# /proc/self/maps lines: mlx's bundled reference BLAS, NumPy's renamed OpenBLAS, and the system's.
MLX_BLAS = "7f0 r-xp 00000000 08:01 12 /venv/site-packages/mlx_cpu.libs/libblas-bd8a282c.so.3.10.0\n"
NUMPY_OPENBLAS = "7f1 r-xp 00000000 08:01 13 /venv/site-packages/numpy.libs/libscipy_openblas64_-32a4b2a6.so\n"
OPENBLAS = "7f2 r-xp 00000000 08:01 14 /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so\n"
ANONYMOUS = "7f3 rw-p 00000000 00:00 0 \n7f4 rw-p 00000000 00:00 0 [heap]\n"
WITHOUT = MLX_BLAS + NUMPY_OPENBLAS + ANONYMOUS


def test_the_reference_blas_is_told_from_the_memory_map():
    assert reference_blas(WITHOUT, "Linux", on_cpu=True)  # NumPy's copy does not count
    assert not reference_blas(WITHOUT + OPENBLAS, "Linux", on_cpu=True)
    assert not reference_blas(WITHOUT, "Darwin", on_cpu=True)  # Accelerate
    assert not reference_blas(WITHOUT, "Linux", on_cpu=False)  # a GPU backend


@pytest.mark.skipif(platform.system() != "Linux", reason="a Linux /proc memory map")
def test_this_process_has_openblas_when_ld_preload_loads_it():
    preloaded = "libopenblas" in os.environ.get("LD_PRELOAD", "")  # as the test instructions set it
    assert reference_blas(Path("/proc/self/maps").read_text(), "Linux", on_cpu=True) is not preloaded


@pytest.mark.skipif(platform.system() != "Linux", reason="the warning is for Linux")
def test_train_and_bench_warn_once_at_start_without_openblas(tmp_path, monkeypatch, capsys):
    train = ["train", "--config", "configs/smoke_test.toml", "--set", "training.max_steps=1",
             "--set", "training.prompts_per_step=2", "--set", "generation.max_new_tokens=8"]
    monkeypatch.setattr(blas, "_maps", lambda: WITHOUT)
    monkeypatch.setattr(blas, "_said", False)
    for run in ("a", "b"):  # two runs in one process, as a sweep's: said once
        assert cli.main([*train, "--set", f'output_dir="{tmp_path / run}"']) == 0
    err = capsys.readouterr().err
    assert err.count("mlx-grpo: warning: no OpenBLAS: float32 matmuls run on mlx's reference BLAS, "
                     "steps about 4x slower\n    sudo apt-get install libopenblas0-pthread\n"
                     f"    export LD_PRELOAD=/usr/lib/{platform.machine()}-linux-gnu/libopenblas.so.0\n") == 1, err
    monkeypatch.setattr(blas, "_said", False)
    assert cli.main(["bench", "--steps", "1", "--generations", "2", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().err.count("mlx-grpo: warning: no OpenBLAS:") == 1

    monkeypatch.setattr(blas, "_maps", lambda: WITHOUT + OPENBLAS)
    monkeypatch.setattr(blas, "_said", False)
    assert cli.main([*train, "--set", f'output_dir="{tmp_path / "c"}"']) == 0
    assert "OpenBLAS" not in capsys.readouterr().err
