"""model.dtype = "auto", the default: bfloat16 on Metal, float32 on the CPU backend (where
bfloat16 trains about 6x slower), stated when training starts."""

import mlx.core as mx
import pytest

from mlx_grpo.commands.setup import build_policy
from mlx_grpo.commands.train import train
from mlx_grpo.config import load_config
from mlx_grpo.models import load as model_load
from mlx_grpo.update.step import optimize

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


@pytest.mark.parametrize("method", ["lora", "dora"])
def test_adapters_on_a_bfloat16_base_are_made_and_kept_float32(method, fixed_rollout):
    from mlx.utils import tree_flatten

    from mlx_grpo.update.optimizer import make_optimizer

    cfg = load_config(None, ["model.dtype=bfloat16", "lora.enabled=true", f'lora.method="{method}"',
                             "generation.num_generations=3", "training.prompts_per_step=2", "grpo.beta=0"])
    model, *_ = build_policy(cfg)
    optimizer = make_optimizer(cfg.training, 10)
    optimize(model, optimizer, None, *fixed_rollout, cfg)
    adapters = dict(tree_flatten(model.trainable_parameters()))
    assert adapters and all(v.dtype == mx.float32 for v in adapters.values())
    assert model.layers[0].mlp.up_proj.linear.weight.dtype == mx.bfloat16  # the frozen base
    assert not any(k.endswith(".master") for k, _ in tree_flatten(optimizer.state))


def test_an_adapter_saved_in_bfloat16_resumes_in_float32(tmp_path):
    from mlx.utils import tree_flatten

    cfg = load_config(None, ["lora.enabled=true"])
    model, *_ = build_policy(cfg)
    saved = {k: (v + 0.001).astype(mx.bfloat16) for k, v in tree_flatten(model.trainable_parameters())}
    mx.save_safetensors(str(tmp_path / "adapters.safetensors"), saved)
    resumed, *_ = build_policy(load_config(None, ["lora.enabled=true", f'lora.resume_adapter="{tmp_path}"']))
    adapters = dict(tree_flatten(resumed.trainable_parameters()))
    assert all(v.dtype == mx.float32 for v in adapters.values())
    assert all(mx.array_equal(adapters[k], saved[k].astype(mx.float32)).item() for k in saved)
