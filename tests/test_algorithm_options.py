"""Each algorithm option, end to end: two real steps on builtin:tiny, checked in metrics.jsonl."""

import math

import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_grpo.config import ConfigError, load_config
from mlx_grpo.run.log import read_metrics
from mlx_grpo.commands.setup import build_policy
from mlx_grpo.commands.train import train
from mlx_grpo.update.settings import UpdateSettings

SMOKE = "configs/smoke_test.toml"
FAST = ["training.max_steps=2", "training.prompts_per_step=2", "generation.max_new_tokens=32",
        "checkpoint.save_every=10", "training.learning_rate=1e-3"]


def _run(tmp_path, *extra, name="run"):
    cfg = load_config(SMOKE, FAST + [f'output_dir="{tmp_path / name}"', *extra])
    train(cfg)
    return cfg, read_metrics(cfg.output_dir)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_clip_metrics_nonzero_when_off_policy(tmp_path, level):
    # num_iterations = 2: the second update sees old_logp != logp. With epsilon = 1e-3 any
    # token (or sequence, for GSPO) the first update moved by more than 0.1% in the direction
    # of its advantage is clipped, so the logged (last-update) clip ratio is above 0.
    # Four prompts, so that some group in each step has unequal rewards.
    _, rows = _run(tmp_path, "grpo.num_iterations=2", "grpo.epsilon=1e-3", "training.prompts_per_step=4",
                   f'grpo.importance_sampling_level="{level}"')
    for r in rows:
        assert r["frac_reward_zero_std"] < 1  # some group has signal, else nothing can clip
        assert 0 < r["clip_ratio/region_mean"] <= 1
        assert r["clip_ratio/region_mean"] == pytest.approx(r["clip_ratio/low_mean"] + r["clip_ratio/high_mean"])


def test_entropy_logged_and_top_entropy_quantile_changes_loss(tmp_path, tiny):
    # Step 1 is on-policy from the same start and seed, so both runs sample the same completions.
    # On all tokens, grpo's loss is mean_i(-A_i) + beta * KL = 0 (advantages sum to 0 per
    # group, KL = 0 before any update; dapo's token mean weights A_i by length, 0 only when the
    # lengths are equal); keeping only the top 20% tokens by entropy breaks that
    # (four prompts, so that the kept tokens are not all in groups with equal rewards).
    grpo = ("training.prompts_per_step=4", 'grpo.loss_type="grpo"')
    _, full = _run(tmp_path, *grpo, name="full")
    _, top = _run(tmp_path, *grpo, "grpo.top_entropy_quantile=0.2", name="top")
    assert full[0]["reward"] == top[0]["reward"]
    assert abs(full[0]["loss"]) < 1e-5
    assert abs(top[0]["loss"]) > 1e-4
    vocab_cap = math.log(tiny[0].args.vocab_size)  # the entropy of a uniform distribution
    for r in full + top:
        assert 0 < r["entropy"] < vocab_cap
    assert full[0]["entropy"] == pytest.approx(top[0]["entropy"], rel=1e-6)


def test_overlong_penalty_is_added_to_rewards(tmp_path):
    # buffer = cap = 32: every completion of l tokens loses l / 32 * 0.5, so the logged
    # penalty mean is -mean_length / 64 exactly
    _, rows = _run(tmp_path, "grpo.overlong_penalty=0.5", "grpo.overlong_buffer=32")
    for r in rows:
        assert r["rewards/overlong_penalty/mean"] == pytest.approx(-r["completions/mean_length"] / 64, rel=1e-6)
        parts = r["rewards/gsm8k_correctness/mean"] + 0.5 * r["rewards/xml_format/mean"]
        assert r["reward"] == pytest.approx(parts + r["rewards/overlong_penalty/mean"], abs=1e-6)


def test_dynamic_sampling_logs_draws_and_trains_on_groups_with_spread(tmp_path):
    _, rows = _run(tmp_path, "grpo.dynamic_sampling=true", "grpo.max_resample_rounds=3")
    for r in rows:
        rounds, drawn = r["dynamic_sampling/rounds"], r["dynamic_sampling/prompts_drawn"]
        assert 1 <= rounds <= 4 and drawn == 2 * rounds
        # reward metrics cover every drawn group, so the flat share is groups_dropped / drawn
        assert r["frac_reward_zero_std"] == pytest.approx(r["dynamic_sampling/groups_dropped"] / drawn)
        assert r["dynamic_sampling/groups_kept"] == min(2, drawn - r["dynamic_sampling/groups_dropped"])
        assert rounds == 1 or r["dynamic_sampling/groups_dropped"] > 0  # another round only when short
        assert np.isfinite(r["loss"])


def test_dynamic_sampling_skips_update_when_no_group_has_spread(tmp_path):
    (tmp_path / "flat.py").write_text("def same(prompts, completions, answers, **kw):\n"
                                      "    return [1.0] * len(completions)\n")
    reward = f'rewards=[{{name="{tmp_path / "flat.py"}:same",weight=1.0}}]'
    cfg = load_config(SMOKE, FAST + [f'output_dir="{tmp_path / "run"}"', reward,
                                     "grpo.dynamic_sampling=true", "grpo.max_resample_rounds=1"])
    before = {k: np.array(v) for k, v in tree_flatten(build_policy(cfg)[0].parameters())}
    ckpt = train(cfg)
    rows = read_metrics(cfg.output_dir)
    assert [r["dynamic_sampling/prompts_drawn"] for r in rows] == [4, 4]  # 2 prompts x 2 rounds
    assert all(r["dynamic_sampling/groups_kept"] == 0 and "loss" not in r for r in rows)
    after = dict(tree_flatten(mlx_lm.load(str(ckpt))[0].parameters()))
    assert all(np.array_equal(before[k], np.array(after[k])) for k in before)


def test_bad_option_values_are_rejected():
    with pytest.raises(ConfigError, match="overlong_buffer must be <= generation.max_new_tokens"):
        load_config(None, ["grpo.overlong_penalty=1.0", "grpo.overlong_buffer=64", "generation.max_new_tokens=32"])
    with pytest.raises(ConfigError, match="importance_sampling_level"):
        load_config(None, ['grpo.importance_sampling_level="seq"'])
    with pytest.raises(ConfigError, match="top_entropy_quantile"):
        load_config(None, ["grpo.top_entropy_quantile=0"])
    for bad in ("grpo.max_resample_rounds=-1", "grpo.overlong_penalty=-0.5", "grpo.overlong_buffer=0",
                "grpo.dynamic_sampling=1"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            load_config(None, [bad])
    # a buffer longer than the cap is fine while the penalty is off
    assert load_config(None, ["grpo.overlong_buffer=64", "generation.max_new_tokens=32"]).grpo.overlong_buffer == 64


def test_docs_algorithm_commands_parse_and_set_the_options():
    import re
    import shlex
    from pathlib import Path

    from mlx_grpo.cli import build_parser

    text = Path("docs/algorithm.md").read_text()
    blocks = [b.replace("\\\n", " ") for b in re.findall(r"```bash\n(.*?)```", text, re.S)]
    commands = [line for b in blocks for line in b.splitlines() if line.startswith("uv run mlx-grpo ")]
    assert len(blocks) == 4 and len(commands) == 5
    parser, _ = build_parser()
    seen, corrections = {}, []
    for line in commands:
        args = parser.parse_args(["train", *shlex.split(line)[3:]])  # drop "uv run mlx-grpo"
        cfg = load_config(args.config, args.overrides)
        g = cfg.grpo
        seen.update({k: getattr(g, k) for k in ("importance_sampling_level", "overlong_penalty",
                                                "top_entropy_quantile") if getattr(g, k) != getattr(type(g)(), k)})
        corrections.append(UpdateSettings.from_config(cfg).importance_sampling_correction)
    assert seen == {"importance_sampling_level": "sequence", "overlong_penalty": 1.0, "top_entropy_quantile": 0.2}
    assert corrections == ["none"] * 3 + ["token_truncate"] * 2  # top_p = 0.7 and an 8-bit copy turn it on


def test_docs_training_commands_run_one_after_another():
    """Every training command of each page (the README, docs/*.md), in order, starts in a folder no earlier one used,
    unless it says --resume or --overwrite (a folder holding a run is refused otherwise)."""
    from pathlib import Path

    from mlx_grpo.cli import build_parser

    parser, _ = build_parser()
    checked = 0
    for page in [Path("README.md"), *sorted(Path("docs").glob("*.md"))]:
        checked += _one_after_another(page, parser)
    assert checked >= 8


def _one_after_another(page, parser) -> int:
    import re
    import shlex
    from pathlib import Path

    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(), re.S)
    lines = [ln for b in blocks for ln in b.replace("\\\n", " ").splitlines() if "mlx-grpo " in ln]
    used, checked = set(), 0
    for line in lines:
        words = shlex.split(line, comments=True)
        programs = [i for i, w in enumerate(words) if w.endswith("mlx-grpo")]
        if not programs:
            continue
        words = words[programs[-1] + 1:]  # `mlx-grpo launch ... -- mlx-grpo train`: the launched command
        if not words or words[0] not in ("train", "--config"):
            continue
        args = parser.parse_args(["train", *words[words[0] == "train":]])
        if not Path(args.config).exists():  # a profile an earlier line of the page writes (config --show > FILE)
            continue
        out = load_config(args.config, args.overrides).output_dir
        if args.resume:
            assert out in used, line
        elif not args.overwrite:
            assert out not in used, f"refused, {out} already holds a run: {line}"
        used.add(out)
        checked += 1
    return checked
