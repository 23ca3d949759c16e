"""A trained run or checkpoint as a standalone model folder (`mlx-grpo export`).

LoRA/DoRA adapters are fused into the base (a quantized base is re-quantized, or turned
back into floats with `dequantize`); a full checkpoint is written as it is. The folder is what
`mlx_lm.load`, `mlx_lm.generate` and `mlx_lm.server` read, plus the run's `config.toml`, from
which `mlx-grpo generate/chat` take the system prompt the model was trained with; its chat
template opens with that prompt too, so mlx-lm asks the model as training did
(models/saved_template.py).
"""

from pathlib import Path

import mlx_lm.utils
from mlx_lm.utils import dequantize_model

from mlx_grpo.models.adapters import fuse_adapters
from mlx_grpo.config import save_config
from mlx_grpo.errors import ModelError
from mlx_grpo.models.convert import output_folder
from mlx_grpo.models.named import load_model
from mlx_grpo.models.saved_template import write_system_prompt
from mlx_grpo.run.guard import check_replaceable
from mlx_grpo.run.layout import CONFIG


def export_model(source: str, out: str, *, adapter: str | None = None, dequantize: bool = False,
                 force: bool = False) -> Path:
    """Write `source` (a run folder, checkpoint, or base plus `adapter`) to `out`; returns it."""
    keep = [("the source", source), ("the adapter", adapter)]
    check_replaceable(out, "--out", keep)  # before minutes of loading and fusing
    loaded = load_model(source, adapter, flag="export")
    keep.append(("the base model", loaded.base_path))
    model = loaded.model
    fuse_adapters(model, dequantize=dequantize)
    config = mlx_lm.utils.load_config(Path(loaded.base_path))
    if dequantize:
        model = dequantize_model(model)
        config.pop("quantization", None)
        config.pop("quantization_config", None)
    try:
        with output_folder(out, force, flag="--out", keep=keep) as tmp:
            mlx_lm.utils.save(tmp, loaded.base_path, model, loaded.tokenizer, config, donate_model=False)
            write_system_prompt(tmp, loaded.system_prompt, loaded.template_kwargs)
            if loaded.config is not None:
                save_config(loaded.config, tmp / CONFIG)
    except (OSError, RuntimeError) as e:  # a full disk; MLX raises RuntimeError for its writes
        reason = getattr(e, "strerror", None) or " ".join(str(e).split())
        raise ModelError(f"--out {out}: cannot write the model ({reason}); "
                         f"nothing was left there or beside it") from e
    return Path(out).expanduser()


def add_arguments(parser):
    parser.add_argument("source", metavar="RUN_DIR_OR_CHECKPOINT", help="a run folder (its newest checkpoint) or a checkpoint")
    parser.add_argument("--out", required=True, metavar="DIR", help="the standalone model folder to write")
    parser.add_argument("--adapter", default=None, metavar="DIR", help="an adapter folder, when SOURCE is its base")
    parser.add_argument("--dequantize", action="store_true", help="write float weights for a quantized base")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")


def main(args) -> Path:
    dst = export_model(args.source, args.out, adapter=args.adapter, dequantize=args.dequantize,
                       force=args.force)
    print(f"mlx-grpo: wrote {dst}")
    return dst
