"""A run with tools resumes exactly: configs/tools_smoke.toml (builtin:tiny-tools calling the
calculator), killed after step 3's metrics row but before its checkpoint, resumes from step 2 and
ends with the uninterrupted run's weights, bit for bit, and its metrics, the tool metrics included."""

import shutil

import mlx.core as mx

from mlx_grpo.commands.train import train
from mlx_grpo.config import load_config
from mlx_grpo.run.log import read_metrics

PROFILE = "configs/tools_smoke.toml"
SMALL = ["training.prompts_per_step=2", "generation.num_generations=4", "checkpoint.save_every=1",
         "logging.log_completions=0"]
TIMING = {"step_time", "tokens_per_second", "peak_memory_gb", "time/rewards"}


def _run(out, steps, *extra):
    cfg = load_config(PROFILE, [*SMALL, f"training.max_steps={steps}", f'output_dir="{out}"', *extra])
    return train(cfg, config_path=PROFILE, progress=False)


def _metrics(out):
    return [{k: v for k, v in row.items() if k not in TIMING and not k.startswith("time/") and "seconds" not in k}
            for row in read_metrics(out)]


def test_a_run_with_tools_stopped_and_resumed_equals_the_uninterrupted_run(tmp_path):
    ref = _run(tmp_path / "ref", 3)
    shutil.copytree(tmp_path / "ref", tmp_path / "cut")
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "step_000003")  # as a SIGKILL before the checkpoint leaves it
    resumed = _run(tmp_path / "cut", 3, "checkpoint.resume=true")
    assert resumed == tmp_path / "cut" / "checkpoints" / "step_000003"
    rows = _metrics(tmp_path / "ref")
    assert sum(r["tools/call_frequency"] for r in rows) > 0  # the episodes called the tool
    assert _metrics(tmp_path / "cut") == rows
    a, b = mx.load(str(ref / "model.safetensors")), mx.load(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys() and all(mx.array_equal(a[k], b[k]).item() for k in a)
