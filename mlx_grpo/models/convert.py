"""Converting a Hugging Face model (hub id or local folder) into an MLX folder (`mlx-grpo convert`).

A thin layer over `mlx_lm.convert`: optional quantization and dtype, nothing uploaded. Also
owns writing a model folder safely, which `export` shares: a destination that is not empty
is refused unless `force` is given, and the folder is written aside and renamed into place,
so a failed or killed run never leaves half a model where the user asked for one.
"""

from contextlib import contextmanager
import os
from pathlib import Path
import shutil

from mlx_grpo.config.paths import is_local_path
from mlx_grpo.errors import ModelError
from mlx_grpo.models.load import hub_or_cache, quiet_convert, resolve_model_path
from mlx_grpo.run.guard import check_replaceable

DTYPES = ("float16", "bfloat16", "float32")


@contextmanager
def output_folder(dst: str | os.PathLike, force: bool = False, flag: str = "--mlx-path", keep=()):
    """Yield a fresh temporary folder that becomes `dst` when the block succeeds.

    `keep`: (what, path) pairs the command reads; `dst` may not be, hold or lie inside one of
    them, nor hold a training run (run/guard.py). The folder is `.<name>.tmp<pid>` beside `dst`;
    one left by a process that no longer runs (a SIGKILL, a power cut), the size of a model, is
    removed first.
    """
    check_replaceable(dst, flag, keep)
    dst = Path(dst).expanduser()
    if dst.exists() and not dst.is_dir():
        raise ModelError(f"{flag} {dst}: exists and is not a folder")
    if dst.is_dir() and any(dst.iterdir()):
        if not force:
            raise ModelError(f"{flag} {dst}: folder is not empty; pass --force to replace it")
        _check_model_folder(dst, flag)
    _remove_abandoned(dst)
    tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if dst.exists():
            shutil.rmtree(dst)
        tmp.rename(dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


MODEL_MARKERS = ("config.json", "adapter_config.json")


def _check_model_folder(dst: Path, flag: str) -> None:
    """--force replaces a model folder (an earlier export or convert), never a folder of anything
    else: `--out ~ --force` must not delete a home folder."""
    if not any((dst / name).is_file() for name in MODEL_MARKERS):
        names = sorted(p.name for p in dst.iterdir())
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise ModelError(f"{flag} {dst}: holds no model (no config.json; it holds {shown}); --force replaces "
                         "only a model folder; choose another folder")


def _remove_abandoned(dst: Path) -> None:
    """Remove the temporary folders of earlier writes of `dst` whose process has ended."""
    if not dst.parent.is_dir():
        return
    prefix = f".{dst.name}.tmp"
    for old in dst.parent.iterdir():
        pid = old.name[len(prefix):]
        if not (old.name.startswith(prefix) and pid.isdigit() and old.is_dir()):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:  # that write ended without cleaning up
            shutil.rmtree(old, ignore_errors=True)
        except PermissionError:  # a live process of another user
            pass


def convert_model(hf_path: str, mlx_path: str, *, quantize: bool = False, q_bits: int = 4,
                  q_group_size: int = 64, dtype: str | None = None, force: bool = False,
                  trust_remote_code: bool = False) -> Path:
    """Write the MLX folder `mlx_path` from `hf_path`; returns it."""
    source = resolve_model_path(hf_path)
    if Path(source).expanduser().is_file():
        raise ModelError(f"--hf-path {hf_path}: is a file, not a model folder")
    if is_local_path(source) and not Path(source).expanduser().is_dir():
        raise ModelError(f"--hf-path {hf_path}: no such folder")
    if not Path(source).expanduser().exists():  # a hub id: one line at once when the hub cannot be reached
        source = hub_or_cache(source, "--hf-path")
    try:
        with output_folder(mlx_path, force, keep=[("the --hf-path folder", source)]) as tmp:
            tmp.rmdir()  # mlx-lm refuses a destination that exists, even an empty one
            quiet_convert(source, str(tmp), quantize=quantize, q_bits=q_bits if quantize else None,
                          q_group_size=q_group_size if quantize else None, dtype=dtype,
                          trust_remote_code=trust_remote_code)
    except Exception as e:
        if type(e).__module__.startswith("huggingface_hub") and not Path(source).expanduser().exists():
            # offline or not found on the hub (its errors are OSErrors too): train's line, naming the flag
            raise ModelError(f"--hf-path: cannot load {hf_path!r} from the hub ({type(e).__name__}: "
                             f"{' '.join(str(e).split())[:300]})") from e
        if not isinstance(e, (OSError, RuntimeError)):
            raise
        # a full disk; MLX raises RuntimeError for its writes
        reason = getattr(e, "strerror", None) or " ".join(str(e).split())
        raise ModelError(f"--mlx-path {mlx_path}: converting {hf_path} failed ({reason}); "
                         "nothing was left there or beside it") from e
    return Path(mlx_path).expanduser()


def add_arguments(parser):
    parser.add_argument("--hf-path", required=True, metavar="ID_OR_DIR", help="a hub id or a local Hugging Face model folder")
    parser.add_argument("--mlx-path", required=True, metavar="DIR", help="the MLX model folder to write")
    parser.add_argument("--quantize", "-q", action="store_true", help="quantize the weights (--q-bits, --q-group-size)")
    parser.add_argument("--q-bits", type=int, default=4, choices=(2, 3, 4, 5, 6, 8), help="bits per weight with --quantize (default 4)")
    parser.add_argument("--q-group-size", type=int, default=64, choices=(32, 64, 128),
                        help="weights sharing one scale with --quantize (default 64)")
    parser.add_argument("--dtype", default=None, choices=DTYPES, help="default: as the checkpoint stores it")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --mlx-path")
    parser.add_argument("--trust-remote-code", action="store_true", help="run the model's own tokenizer code (off by default)")


def main(args) -> Path:
    dst = convert_model(args.hf_path, args.mlx_path, quantize=args.quantize, q_bits=args.q_bits,
                        q_group_size=args.q_group_size, dtype=args.dtype, force=args.force,
                        trust_remote_code=args.trust_remote_code)
    print(f"mlx-grpo: wrote {dst}")
    return dst
