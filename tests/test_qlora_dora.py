"""QLoRA, DoRA and lora.resume_adapter on the built-in tiny model."""

import json

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import pytest
from mlx.utils import tree_flatten
from mlx_lm.tuner.dora import DoRALinear

from mlx_grpo.config import ConfigError, load_config
from mlx_grpo.errors import TrainingError
from mlx_grpo.rng import seed_everything
from mlx_grpo.commands.setup import build_policy
from mlx_grpo.commands.train import train

SMOKE = "configs/smoke_test.toml"
ONE_STEP = ["training.max_steps=1", "training.prompts_per_step=2", "generation.max_new_tokens=24",
            "lora.enabled=true", "lora.rank=4", "training.learning_rate=1e-2"]


def _cfg(tmp_path, *extra):
    return load_config(SMOKE, ONE_STEP + [f'output_dir="{tmp_path / "run"}"', *extra])


def _params(model) -> dict:
    return {k: mx.array(v) for k, v in tree_flatten(model.parameters())}


@pytest.mark.parametrize("bits", [4, 8])
def test_qlora_changes_only_lora_parameters(tmp_path, bits):
    # group size 32 divides the tiny model's hidden size (128) and its MLP width (384).
    # Two steps: lora_b starts at 0, so lora_a gets its first gradient in the second step.
    cfg = _cfg(tmp_path, f"model.quantize_bits={bits}", "model.quantize_group_size=32", "training.max_steps=2")
    seed_everything(cfg.seed)  # train() seeds the same way, so its adapters start equal to these
    before, _, base_path, _ = build_policy(cfg)
    assert isinstance(before.layers[0].self_attn.q_proj.linear, nn.QuantizedLinear)
    trainable = {k for k, _ in tree_flatten(before.trainable_parameters())}
    assert trainable and all(k.rsplit(".", 1)[-1] in ("lora_a", "lora_b") for k in trainable)
    start = _params(before)

    ckpt = train(cfg)
    after, _ = mlx_lm.load(base_path, adapter_path=str(ckpt))
    end = _params(after)
    assert set(end) == set(start)
    changed = {k for k in start if not mx.array_equal(start[k], end[k]).item()}
    assert changed == trainable  # every adapter moved, nothing else (the packed base included)
    assert json.loads((ckpt / "adapter_config.json").read_text())["fine_tune_type"] == "lora"


def test_dora_adapter_trains_and_loads_in_mlx_lm(tmp_path, tiny_path):
    cfg = _cfg(tmp_path, 'lora.method="dora"')
    ckpt = train(cfg)
    assert json.loads((ckpt / "adapter_config.json").read_text())["fine_tune_type"] == "dora"
    saved = mx.load(str(ckpt / "adapters.safetensors"))
    assert {k.rsplit(".", 1)[-1] for k in saved} == {"lora_a", "lora_b", "m"}
    tuned, _ = mlx_lm.load(tiny_path, adapter_path=str(ckpt))
    assert isinstance(tuned.layers[0].mlp.up_proj, DoRALinear)
    base, _ = mlx_lm.load(tiny_path)
    x = mx.array([[1, 2, 3, 4]])
    assert not mx.allclose(base(x), tuned(x)).item()


def test_resume_adapter_starts_from_the_saved_weights(lora_run):
    ckpt = lora_run / "checkpoints" / "step_000002"
    cfg = load_config(SMOKE, ONE_STEP + [f'lora.resume_adapter="{ckpt}"'])
    model, *_ = build_policy(cfg)
    saved = mx.load(str(ckpt / "adapters.safetensors"))
    loaded = dict(tree_flatten(model.trainable_parameters()))
    assert set(loaded) == set(saved)
    assert all(mx.array_equal(loaded[k], saved[k]).item() for k in saved)
    assert any(not mx.all(v == 0).item() for k, v in saved.items() if k.endswith("lora_b"))


def test_resume_adapter_of_another_shape_is_refused(lora_run, tmp_path):
    ckpt = lora_run / "checkpoints" / "step_000002"
    cfg = load_config(SMOKE, ONE_STEP + ["lora.rank=2", f'lora.resume_adapter="{ckpt}"'])
    with pytest.raises(TrainingError, match=r"lora.resume_adapter: .*lora_[ab] has shape \(4, .*\(2, .*check lora.rank"):
        build_policy(cfg)
    cfg = load_config(SMOKE, ONE_STEP + ['lora.method="dora"', f'lora.resume_adapter="{ckpt}"'])
    with pytest.raises(TrainingError, match=r"lora.resume_adapter: .*lacks .*\.m\b"):
        build_policy(cfg)
    cfg = load_config(SMOKE, ONE_STEP + [f'lora.resume_adapter="{tmp_path}"'])
    with pytest.raises(TrainingError, match="adapters.safetensors not found"):
        build_policy(cfg)


def test_lora_config_keys_are_checked():
    with pytest.raises(ConfigError, match=r"lora.method must be one of 'lora', 'dora', got 'qlora'"):
        load_config(SMOKE, ['lora.method="qlora"'])
    with pytest.raises(ConfigError, match="lora.resume_adapter .* lora.enabled is false"):
        load_config(SMOKE, ['lora.resume_adapter="runs/x"'])
