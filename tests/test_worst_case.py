"""Worst case first and flat memory (issue 18): the update before step 1 runs at the longest
shapes and changes nothing, and peak memory stays where it is after step 5."""

import resource

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

import mlx_grpo
from mlx_grpo.commands.plan import worst_case_wanted
from mlx_grpo.commands.setup import setup
from mlx_grpo.commands.train import train
from mlx_grpo.config import load_config
from mlx_grpo.rng import capture_rng
from mlx_grpo.run.log import read_metrics
from mlx_grpo.update.worst_case import CACHE_SHARE, worst_case_rollout, worst_case_update

SMOKE = "configs/smoke_test.toml"
SHAPES = ["training.prompts_per_step=2", "generation.num_generations=4", "data.max_prompt_tokens=70",
          "generation.max_new_tokens=40", "checkpoint.save_every=10", "logging.log_completions=0",
          "training.learning_rate=1e-3"]


# the micro-batch's (inputs, targets) shapes: padded rows hold 70 + 40 tokens padded to 128 and
# 40 completion tokens padded to 64; with shared prefixes the prompt runs apart and the rows
# hold the completion alone
@pytest.mark.parametrize("shared, inputs", [(False, (3, 128)), (True, (3, 64))])
def test_the_probe_runs_at_the_longest_shapes_and_changes_no_weight_or_random_state(shared, inputs):
    cfg = load_config(SMOKE, SHAPES + ["lora.enabled=true", "lora.rank=4", "lora.dropout=0.1",
                                       "training.micro_batch_size=3", f"training.shared_prefix={str(shared).lower()}"])
    tr = setup(cfg, total_updates=1)
    shapes = []

    def grad_fn(batch):  # the run's own gradient, its input shapes noted
        shapes.append((batch.inputs.shape, batch.targets.shape))
        return tr.grad_fn(batch)

    before = {k: np.array(v) for k, v in tree_flatten(tr.model.parameters())}
    tr.model.eval()
    rng = capture_rng()
    probe = worst_case_update(tr.model, tr.ref_model, grad_fn, tr.settings, cfg)
    assert shapes == [(inputs, (3, 64))]  # 3 of the 8 rows: the micro-batch
    assert (probe["rows"], probe["tokens"]) == (3, 110) and probe["peak_gb"] > 0
    assert capture_rng() == rng  # LoRA dropout drew random numbers; they were put back
    assert tr.model.training is False
    after = dict(tree_flatten(tr.model.parameters()))
    assert all(np.array_equal(before[k], np.array(after[k])) for k in before)


def test_the_kv_probe_fills_the_cache_to_the_longest_rollout_and_draws_no_random_numbers(monkeypatch):
    from mlx_lm.models import cache as cache_mod

    cfg = load_config(SMOKE, SHAPES + ["generation.batch_size=6"])
    tr = setup(cfg, total_updates=1)
    made = []
    real = cache_mod.make_prompt_cache
    monkeypatch.setattr(cache_mod, "make_prompt_cache", lambda model: made.append(real(model)) or made[-1])
    rng = capture_rng()
    assert worst_case_rollout(tr.model, cfg) == (6, 110)  # batch_size of the 8 sequences, 70 + 40 tokens
    assert capture_rng() == rng
    (cache,) = made
    assert len(cache) == 4 and all(c.offset == 110 and c.keys.shape[0] == 6 for c in cache)
    assert cache[0].keys.shape[2] >= 110  # allocated as decoding would (mlx-lm's 256-token steps)


def _run(out, *extra):
    cfg = load_config(SMOKE, SHAPES + ["training.max_steps=2", f'output_dir="{out}"', *extra])
    final = train(cfg)
    timing = ("step_time", "tokens_per_second", "peak_memory_gb", "time/rewards")
    return [{k: v for k, v in r.items() if k not in timing} for r in read_metrics(out)], mx.load(
        str(final / "adapters.safetensors"))


def test_a_run_with_the_probe_trains_bitwise_as_one_without(tmp_path, capsys):
    lora = ["lora.enabled=true", "lora.rank=4", "lora.dropout=0.1"]  # dropout: the probe draws random numbers
    with_probe, weights = _run(tmp_path / "on", 'training.worst_case_first="always"', *lora)
    out = capsys.readouterr().out
    assert "worst case first: the rollout's KV cache at 8 sequences x 110 tokens peaked at " in out
    assert "one update at the longest shapes (8 rows x 70 prompt + 40 completion tokens) at " in out
    without, plain = _run(tmp_path / "off", 'training.worst_case_first="never"', *lora)
    assert "worst case first" not in capsys.readouterr().out
    assert with_probe == without and with_probe[1]["loss"] != 0
    assert all(mx.array_equal(weights[k], plain[k]).item() for k in plain)


def test_auto_runs_the_probe_only_when_the_plan_is_above_half_the_device():
    huge = ["generation.num_generations=1024", "data.max_prompt_tokens=131072"]  # terabytes
    assert not worst_case_wanted(load_config(SMOKE))  # builtin:tiny: 4.7 GB at the longest shapes
    assert worst_case_wanted(load_config(SMOKE, huge))
    assert worst_case_wanted(load_config(SMOKE, ['training.worst_case_first="always"']))
    assert not worst_case_wanted(load_config(SMOKE, ['training.worst_case_first="never"', *huge]))


# --- memory stays flat ----------------------------------------------------------------------------

@pytest.mark.parametrize("steps", [25, pytest.param(120, marks=pytest.mark.slow)])  # 120: 77 s here
def test_peak_memory_stays_flat_over_many_steps(tmp_path, steps):
    """Every step has the same prompt and completions of at most 8 tokens, so its shapes never
    grow: a peak above step 5's would be memory kept from earlier steps."""
    seen = []

    def memory_probe(prompts, completions, answers, **kwargs):  # called once per step, mid-step
        seen.append((mx.get_active_memory(), mx.get_cache_memory(),
                     resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
        return [float(sum(map(ord, c)) % 3) for c in completions]  # spread: real updates

    rows = [{"question": "What is 12 + 34?", "answer": "46"}] * 64
    out = mlx_grpo.train(SMOKE, rewards=[memory_probe], dataset=rows, output_dir=str(tmp_path / "run"),
                         training={"max_steps": steps, "prompts_per_step": 2}, generation={"max_new_tokens": 8},
                         checkpoint={"save_every": 1000}, logging={"log_completions": 0})
    peaks = [r["peak_memory_gb"] for r in read_metrics(out)]
    assert len(peaks) == len(seen) == steps and any(r["grad_norm"] > 0 for r in read_metrics(out))
    assert max(peaks[5:]) <= 1.03 * peaks[4], peaks  # 120 steps measured: +0.14% at most
    active = [a for a, _, _ in seen]
    # Mid-step active memory moves between a few levels with the completions' lengths (10.0-11.3 MB
    # here); memory kept across steps would lift its floor.
    assert min(active[-10:]) <= 1.01 * min(active[5:15]), active
    limit = mx.set_cache_limit(0)
    mx.set_cache_limit(limit)
    assert all(cache <= limit for _, cache, _ in seen)
    assert seen[-1][2] <= 1.05 * seen[4][2]  # the process's own high-water mark (RSS)


def test_the_cache_limit_is_an_eighth_of_the_device_above_or_below_mlx_default():
    from mlx_grpo.update.worst_case import limit_cache

    default = mx.set_cache_limit(0)
    try:
        mx.set_cache_limit(default)
        assert limit_cache(default * 100) == int(default * 100 * CACHE_SHARE) == mx.set_cache_limit(default)
        assert limit_cache(8e6) == int(8e6 * CACHE_SHARE) == mx.set_cache_limit(default)
    finally:
        mx.set_cache_limit(default)


def test_the_probe_gives_each_group_its_own_prompt_on_the_shared_prefix_path():
    cfg = load_config(SMOKE, SHAPES + ["training.shared_prefix=true"])  # one micro-batch: 2 groups of 4
    tr = setup(cfg, total_updates=1)
    prompts = []

    def grad_fn(batch):
        prompts.append(batch.prefix.shape[0])
        return tr.grad_fn(batch)

    worst_case_update(tr.model, tr.ref_model, grad_fn, tr.settings, cfg)
    assert prompts == [2]  # one prefix pass per group, as real data makes; one shared prompt read low
