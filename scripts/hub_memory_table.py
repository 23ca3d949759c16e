"""docs/memory.md's table for the hub profiles: `mlx-grpo plan` for each on 16, 24, 32 and
64 GB Macs, without downloading a model.

    uv run python scripts/hub_memory_table.py

The planner reads a model's config.json and safetensors headers. For the Qwen2.5 models the
profiles name, this script writes both into a temporary folder: the config.json values the
models publish (ARCHITECTURES below) and a safetensors file whose header lists the tensors
mlx-lm's qwen2 model has for that config, in bfloat16, and whose data is a sparse hole (nothing
is allocated: MLX builds the model lazily and only the shapes are read). Each profile is planned in
bfloat16, as `model.dtype = "auto"` loads it on a Mac, against three quarters of the Mac's
memory (`--memory-gb` 12, 18, 24, 48), about what Metal's recommended working set is and
what `plan` compares with there.
"""

import argparse
import json
import struct
import sys
import tempfile
from pathlib import Path

from mlx_grpo.commands.plan import plan
from mlx_grpo.config import load_config

# config.json of each model as published (architecture keys only; all tie their embeddings).
ARCHITECTURES = {
    "Qwen/Qwen2.5-0.5B-Instruct": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                                       num_key_value_heads=2, intermediate_size=4864),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                                       num_key_value_heads=2, intermediate_size=8960),
}
COMMON = dict(model_type="qwen2", vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1000000.0,
              tie_word_embeddings=True, max_position_embeddings=32768)
PROFILES = ["configs/default.toml", "configs/production.toml", "configs/tldr.toml"]
MACS = {16: 12, 24: 18, 32: 24, 64: 48}  # GB of memory: GB the plan may use (three quarters)


def header_only_model(repo: str, folder: Path) -> Path:
    """config.json and a model.safetensors for `repo`'s architecture whose data is a sparse hole."""
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen2

    config = {**COMMON, **ARCHITECTURES[repo]}
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))  # lazy: shapes only, nothing computed
    header, offset = {}, 0
    for name, value in tree_flatten(model.parameters()):
        size = value.size * 2
        header[name] = {"dtype": "BF16", "shape": list(value.shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + offset)  # the data as a hole: the file is whole, no byte written
    return folder


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = {repo: header_only_model(repo, Path(tmp) / repo.replace("/", "--")) for repo in ARCHITECTURES}
        for profile in PROFILES:
            cfg = load_config(profile)
            repo = cfg.model.path
            cfg.model.path, cfg.model.dtype = str(folders[repo]), "bfloat16"
            results = {mac: plan(cfg, gb) for mac, gb in MACS.items()}
            first = results[16]
            phases = first["phases_gb"]
            fix = next((r["suggestions"][0] for r in results.values() if r["suggestions"]), None)
            rows.append([profile, repo, f"{phases['rollout']:.1f}", f"{phases['update']:.1f}",
                         f"{first['peak_gb']:.1f}", *("yes" if r["fits"] else "no" for r in results.values()),
                         f"`--set {fix[0]}` ({fix[1]:.1f} GB)" if fix else ""])
    head = ["profile", "model", "rollout (GB)", "update (GB)", "peak (GB)", *(f"{m} GB Mac" for m in MACS),
            "first change that fits the smallest Mac it does not"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    sys.exit(main())
