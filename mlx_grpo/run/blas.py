"""Whether float32 matmuls have a fast BLAS here, and the one warning line when they have not.

On Linux, mlx's CPU wheels carry the reference BLAS; OpenBLAS, preloaded, takes its routines'
place (LD_PRELOAD). Without it a training step takes about 4x as long (`mlx-grpo bench` on
builtin:tiny: 1.46 s a step against 0.33 s; a 256x512 @ 512x512 matmul 27 ms against 1.2 ms).
What counts is the library mapped into this process, not the LD_PRELOAD variable: a wrong path
there loads nothing. On macOS mlx uses Accelerate, and a GPU backend does not use the BLAS.
"""

from pathlib import Path
import platform
import sys

_said = False  # a sweep trains several runs in one process: the warning is printed once


def reference_blas(maps: str, system: str, on_cpu: bool) -> bool:
    """Whether float32 matmuls run on the reference BLAS: Linux, the CPU backend, and no
    libopenblas in `maps` (the text of /proc/self/maps). NumPy's own copy of OpenBLAS
    (libscipy_openblas64_) does not count: its routines are renamed, mlx never calls them."""
    if system != "Linux" or not on_cpu:
        return False
    mapped = (Path(line.split()[-1]).name for line in maps.splitlines() if "/" in line)
    return not any(name.startswith("libopenblas") for name in mapped)


def warning(machine: str) -> str:
    """The warning, and under it the two commands that fix it, each whole on its line to be copied."""
    return ("mlx-grpo: warning: no OpenBLAS: float32 matmuls run on mlx's reference BLAS, steps about 4x slower\n"
            "    sudo apt-get install libopenblas0-pthread\n"
            f"    export LD_PRELOAD=/usr/lib/{machine}-linux-gnu/libopenblas.so.0")


def _maps() -> str | None:
    """This process's memory map, or None where there is no /proc (macOS, a sandbox)."""
    try:
        return Path("/proc/self/maps").read_text()
    except OSError:
        return None


def warn_if_slow(say) -> None:
    """say(the warning) when this process multiplies on the reference BLAS; once per process."""
    global _said
    if _said or (maps := _maps()) is None:  # without a map nothing is known, and nothing said
        return
    import mlx.core as mx

    _said = True
    if reference_blas(maps, platform.system(), mx.default_device().type == mx.DeviceType.cpu):
        say(warning(platform.machine()), file=sys.stderr)
