"""model.dtype = "auto", the default: bfloat16 on Metal, float32 on the CPU backend (where
bfloat16 trains about 6x slower), stated when training starts."""

import mlx.core as mx
import pytest

from mlx_grpo.commands.setup import build_policy
from mlx_grpo.commands.train import train
from mlx_grpo.config import load_config
from mlx_grpo.models import load as model_load

FAST = ["training.max_steps=1", "training.prompts_per_step=2", "generation.max_new_tokens=8"]


def test_auto_is_float32_on_the_cpu_backend_and_bfloat16_on_metal(monkeypatch):
    assert load_config(None).model.dtype == "auto"
    monkeypatch.setattr(mx.metal, "is_available", lambda: False)
    assert model_load.resolve_dtype("auto") == "float32"
    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu))
    assert model_load.resolve_dtype("auto") == "bfloat16"
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.cpu))  # Metal there, CPU chosen
    assert model_load.resolve_dtype("auto") == "float32"
    assert model_load.resolve_dtype("float16") == "float16"


@pytest.mark.parametrize(("dtype", "expected"), [("auto", mx.float32), ("bfloat16", mx.bfloat16)])
def test_the_policy_loads_in_the_resolved_dtype(dtype, expected):
    model, *_ = build_policy(load_config(None, [f"model.dtype={dtype}"]))
    assert model.layers[0].mlp.up_proj.weight.dtype == expected


def test_the_start_of_a_run_states_the_dtype(tmp_path, capsys):
    train(load_config("configs/smoke_test.toml", FAST + [f'output_dir="{tmp_path}"']))
    lines = [line for line in capsys.readouterr().out.splitlines() if "model.dtype" in line]
    assert lines == ["mlx-grpo: model.dtype = auto: float32 here (bfloat16 on Metal, "
                     "float32 on the CPU backend)"]
