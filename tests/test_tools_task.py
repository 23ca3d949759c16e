"""The shipped tools task: its data is what its script makes, its calculator and reward, and its
profile resolves its tool and reward before any weight loads."""

import json
from pathlib import Path

import pytest
from checks import import_from

from mlx_grpo.config import load_config
from mlx_grpo.tools import completion_cap, make_toolset

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("split", ["train", "test"])
def test_the_shipped_sums_are_what_the_script_makes(split):
    rows = import_from("scripts", "make_sums_data").sums_rows(split)
    assert (ROOT / "data" / f"sums_{split}.jsonl").read_text() == "".join(json.dumps(r) + "\n" for r in rows)
    assert all(100 <= int(q) <= 999 for r in rows for q in r["question"][8:-1].split(" + "))


def test_train_and_test_share_no_question():
    make = import_from("scripts", "make_sums_data").sums_rows
    assert not {r["question"] for r in make("train")} & {r["question"] for r in make("test")}


def test_calculator_and_reward():
    tools = import_from("examples", "calculator_tools")
    assert tools.calculator("347 + 586") == "933" and tools.calculator("10 - 3+1") == "8"
    for bad in ("3 +", "x + 1", "2 2"):
        with pytest.raises(ValueError, match="cannot read"):
            tools.calculator(bad)
    called = [{"role": "assistant", "content": "<tool_call>...</tool_call>"},
              {"role": "tool", "name": "calculator", "content": "933"},
              {"role": "assistant", "content": "<answer>933</answer>"}]
    guessed = [{"role": "assistant", "content": "<answer>932</answer>"}]
    unfinished = [{"role": "assistant", "content": "<answer>93"}]
    assert tools.correct_answer(["", "", ""], [933, 933, 933], [called, guessed, unfinished]) == [1.0, 0.0, 0.0]


def test_the_profile_resolves_its_tool_and_sizes_memory_by_the_episode():
    path = ROOT / "configs" / "tools_smoke.toml"
    cfg = load_config(path)
    assert make_toolset(cfg, str(path)).names == ["calculator"]
    assert completion_cap(cfg) == 224 and cfg.generation.max_new_tokens == 96  # the plan sizes by the episode
    assert cfg.tools.schemas_in == "none"  # the prompts builtin:tiny-tools was warm-started on, and measured with
