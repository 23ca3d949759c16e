"""The worked example of a task of its own (configs/steps.toml): its data is what its script
makes, its rewards read the data's own fields (one gives None for one-step rows), and the
profile trains (two short steps here; the learning across seeds is in docs/benchmarks.md)."""

import json
from pathlib import Path

import pytest
from checks import import_from

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("split", ["train", "test"])
def test_the_shipped_data_is_what_the_script_makes(split):
    rows = import_from("scripts", "make_steps_data").steps_rows(split)
    assert (ROOT / "data" / f"steps_{split}.jsonl").read_text() == "".join(json.dumps(r) + "\n" for r in rows)
    assert sum(r["steps"] == 1 for r in rows) * 2 == len(rows) and all(type(r["answer"]) is int for r in rows)
    # "<reasoning>\n" 12 + one "a + b = c\n" line (10) per step + "</reasoning>\n" 13 + "<answer>\n" 9 + "5\n" 2
    # + "</answer>" 9 = 45 + 10 * steps, plus 5 to spare
    assert all(r["max_chars"] == 50 + 10 * r["steps"] for r in rows)


def test_the_examples_rewards_read_the_rows_fields():
    rewards = import_from("examples", "steps_rewards")
    one_line = "<reasoning>\n2 + 7 - 2 = 7\n</reasoning>\n<answer>\n7\n</answer>"  # 59 characters
    worked = "<reasoning>\n2 + 7 = 9\n9 - 2 = 7\n</reasoning>\n<answer>\n7\n</answer>"  # 65
    assert rewards.shows_each_step([one_line, worked, worked], steps=[2, 2, 1]) == [0.0, 1.0, None]
    # 65 characters against 70: 1.0; against 50: 1 - 15 / 50 = 0.7; 200 against 50: 1 - 150 / 50 < 0 -> 0.0
    assert rewards.within_budget([worked, worked, "x" * 200], max_chars=[70, 50, 50]) == [1.0, 0.7, 0.0]


def test_the_profile_trains_and_counts_the_rows_its_reward_leaves_out(tmp_path):
    from mlx_grpo.commands.train import train
    from mlx_grpo.config import load_config
    from mlx_grpo.data.examples import PromptStream, load_examples
    from mlx_grpo.models.load import load_base
    from mlx_grpo.run.log import read_metrics

    cfg = load_config(ROOT / "configs" / "steps.toml", [
        "training.max_steps=2", "training.prompts_per_step=4", "generation.max_new_tokens=32",
        f'output_dir="{tmp_path / "run"}"', "checkpoint.save_every=10",
    ])
    train(cfg, config_path=str(ROOT / "configs" / "steps.toml"))
    rows = read_metrics(cfg.output_dir)
    # the prompts each step drew, as the run's seeded walk over the training rows draws them
    stream = PromptStream(load_examples(cfg.data, load_base(cfg.model)[1]), True, cfg.seed)
    for row in rows:
        one_step = sum(e.columns["steps"] == 1 for e in stream.take(4)) / 4
        assert row["rewards/shows_each_step/none_frac"] == one_step
        assert 0 <= row["rewards/within_budget/mean"] <= 1 and row["rewards/gsm8k_correctness/none_frac"] == 0
