"""End to end: a few real GRPO steps on the built-in tiny model."""

import json

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_grpo.config import load_config
from mlx_grpo.run.log import read_metrics
from mlx_grpo.commands.setup import build_policy
from mlx_grpo.commands.train import train

SMOKE = "configs/smoke_test.toml"
FAST = ["training.max_steps=2", "training.prompts_per_step=2", "generation.max_new_tokens=32",
        "checkpoint.save_every=1", "training.learning_rate=1e-3", "grpo.beta=0.04"]
TIMING = {"step_time", "tokens_per_second", "peak_memory_gb", "time/rewards"}


def _cfg(tmp_path, *extra):
    return load_config(SMOKE, FAST + [f'output_dir="{tmp_path / "run"}"', *extra])


def test_full_finetune_changes_every_parameter_and_checkpoint_loads(tmp_path):
    cfg = _cfg(tmp_path)
    before, *_ = build_policy(cfg)
    before = dict(tree_flatten(before.trainable_parameters()))
    ckpt = train(cfg)
    rows = read_metrics(cfg.output_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for key in ["loss", "reward", "reward_std", "rewards/gsm8k_correctness/mean", "rewards/xml_format/std",
                "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio", "kl",
                "clip_ratio/region_mean", "grad_norm", "learning_rate", "step_time", "tokens_per_second",
                "peak_memory_gb"]:
        assert all(np.isfinite(r[key]) for r in rows), key
    assert rows[0]["learning_rate"] == pytest.approx(1e-3)

    model, tokenizer = mlx_lm.load(str(ckpt))
    after = dict(tree_flatten(model.parameters()))
    unchanged = [k for k, v in before.items() if mx.array_equal(v, after[k]).item()]
    assert not unchanged
    text = mlx_lm.generate(model, tokenizer, "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n", max_tokens=8)
    assert isinstance(text, str) and text
    assert (tmp_path / "run" / "config.toml").exists()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step_000001", "step_000002"]


def test_lora_trains_only_adapters_and_loads_in_mlx_lm(tmp_path, tiny_path):
    cfg = _cfg(tmp_path, "lora.enabled=true", "lora.rank=4", "training.learning_rate=1e-2")
    ckpt = train(cfg)
    adapter_cfg = json.loads((ckpt / "adapter_config.json").read_text())
    assert adapter_cfg["lora_parameters"]["scale"] == pytest.approx(16.0 / 4)
    saved = mx.load(str(ckpt / "adapters.safetensors"))
    assert saved and all(k.rsplit(".", 1)[-1] in ("lora_a", "lora_b") for k in saved)
    assert all(not mx.all(v == 0).item() for k, v in saved.items() if k.endswith("lora_b"))

    base, _ = mlx_lm.load(tiny_path)
    tuned, _ = mlx_lm.load(tiny_path, adapter_path=str(ckpt))
    x = mx.array([[1, 2, 3, 4]])
    assert not mx.allclose(base(x), tuned(x)).item()
    base_w = dict(tree_flatten(base.parameters()))
    for k, v in tree_flatten(tuned.parameters()):
        if "lora" not in k:
            assert mx.array_equal(v, base_w[k.replace(".linear.", ".")]).item(), k


def test_same_seed_gives_identical_runs(tmp_path):
    runs = []
    for name in ("a", "b"):
        cfg = load_config(SMOKE, FAST + [f'output_dir="{tmp_path / name}"', "checkpoint.save_every=10"])
        train(cfg)
        runs.append([{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(cfg.output_dir)])
    assert runs[0] == runs[1]


def test_the_largest_seed_trains_and_the_next_is_refused_in_one_line(tmp_path, capsys):
    """`seed` and the commands' --seed take [0, 2**32), the range NumPy seeds: 2**32 - 1 trains
    a step end to end, 2**32 stops at load time. Before, the config took [0, 2**63) and
    np.random.seed failed with a traceback at 2**32."""
    from mlx_grpo.cli import main
    from mlx_grpo.config import ConfigError

    cfg = _cfg(tmp_path, "training.max_steps=1", f"seed={2**32 - 1}")
    train(cfg)
    (row,) = read_metrics(cfg.output_dir)
    assert np.isfinite(row["loss"])
    with pytest.raises(ConfigError, match=r"^--set seed=4294967296: seed must be in \[0, 2\*\*32\), got 4294967296$"):
        _cfg(tmp_path, f"seed={2**32}")
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--config", SMOKE, "--seed", str(2**32)])
    assert exit_.value.code == 2 and "must be in [0, 2**32), got 4294967296" in capsys.readouterr().err


def test_step_one_completions_do_not_depend_on_beta_reference_or_eval(tmp_path):
    """The same seed samples the same step-1 completions whether beta is 0 (no reference) or
    0.04 (a frozen copy loaded), under LoRA (the reference is the base without adapters,
    whose zero-initialised B leaves the policy's outputs unchanged), and with sampled eval
    every step. Before 8d0a385, loading the reference drew random numbers (layer init) after
    seeding, so a beta sweep's runs sampled different completions from step 1."""
    variants = {
        "beta0": ["grpo.beta=0"],
        "beta": ["grpo.beta=0.04"],
        "lora": ["grpo.beta=0.04", "lora.enabled=true", "lora.rank=4"],
        "eval": ["grpo.beta=0", "eval.every=1", "eval.limit=2", "eval.num_samples=2", "eval.temperature=0.7"],
    }
    texts = {}
    for name, extra in variants.items():
        cfg = _cfg(tmp_path / name, "training.max_steps=1", "checkpoint.save_every=10", "logging.log_completions=8",
                   *extra)
        train(cfg)
        rows = [json.loads(line) for line in (tmp_path / name / "run" / "completions.jsonl").read_text().splitlines()]
        assert len(rows) == 8  # every completion of the step: 2 prompts x G = 4
        texts[name] = [(r["prompt"], r["completion"], r["reward"]) for r in rows]
    assert len({tuple(t) for t in texts.values()}) == 1, {k: v[0] for k, v in texts.items()}
