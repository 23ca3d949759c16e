
import mlx.core as mx
import pytest


@pytest.fixture
def random_qwen2():
    """A 2-layer random Qwen2 with a 64-token vocabulary: enough to check shapes and math."""
    from mlx_lm.models import qwen2

    mx.random.seed(0)
    args = qwen2.ModelArgs(
        model_type="qwen2", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=64,
        tie_word_embeddings=True,
    )
    model = qwen2.Model(args)
    mx.eval(model.parameters())
    return model


@pytest.fixture
def fixed_rollout():
    """(rollout, rewards): 2 prompts x G=3 fixed completions of ids < 64, so repeated updates see
    the same tokens whatever the weights (drive `update.step.optimize` with it)."""
    import numpy as np

    from mlx_grpo.rollout.sample import Rollout

    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 64, 5).tolist(), rng.integers(1, 64, 9).tolist()]
    rollout = Rollout(
        prompt_tokens=[prompts[i // 3] for i in range(6)],
        completion_tokens=[rng.integers(1, 64, n).tolist() for n in (3, 7, 12, 1, 5, 9)],
        texts=[""] * 6, truncated=[False] * 6, group_size=3,
    )
    return rollout, [1.0, 0.0, 0.5, 0.0, 1.0, 1.0]


@pytest.fixture(scope="session")
def tiny_path():
    """The built-in warm-started tiny model, as shipped in the package."""
    from mlx_grpo.models.builtin import builtin_model_path

    return str(builtin_model_path("tiny"))


@pytest.fixture(scope="session")
def tiny(tiny_path):
    import mlx_lm

    return mlx_lm.load(tiny_path)


@pytest.fixture(scope="session")
def lora_run(tmp_path_factory):
    """A LoRA run of two GRPO steps on builtin:tiny, shared by the tests of trained models."""
    from mlx_grpo.config import load_config
    from mlx_grpo.commands.train import train

    out = tmp_path_factory.mktemp("lora_run") / "run"
    cfg = load_config("configs/smoke_test.toml", [
        "training.max_steps=2", "training.prompts_per_step=2", "generation.max_new_tokens=32",
        "checkpoint.save_every=1", "lora.enabled=true", "lora.rank=4", "training.learning_rate=1e-2",
        f'output_dir="{out}"',
    ])
    train(cfg)
    return out


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that skips for want of an optional extra must carry the `extra` mark: .ci/run runs
    only those again with the extras installed, so an unmarked one would never run in CI."""
    report = (yield).get_result()
    if report.skipped and "extra" not in item.keywords and call.excinfo is not None:
        reason = str(call.excinfo.value)
        if "could not import" in reason or "extra is not installed" in reason:
            report.outcome, report.longrepr = "failed", f"skipped for an extra but not marked extra: {reason}"
