"""The reward contract, as TRL's GRPOTrainer has it: every field of the row reaches the rewards
(repeated per completion), with completion_ids and trainer_state; TRL-form functions from TRL's
documentation run unchanged beside this project's `fn(prompts, completions, answers, **kwargs)`;
None means "not mine to score"; async functions are awaited; bad output is one line naming the
reward and the data row."""

import asyncio
from dataclasses import replace
import math
import re

import pytest

from mlx_grpo.data.examples import Example
from mlx_grpo.rewards import RewardError, RewardSet, TrainerState
from mlx_grpo.rollout.score import reward_batch

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]


def _examples():
    """Two rows, the second conversational; fields beyond prompt and answer: ground_truth, task."""
    return [
        Example("What is 2 + 3?", "p0", [1], 5, {"answer": 5, "ground_truth": "5", "task": "math"}, None, 7),
        Example("What is 2 + 3?", "p1", [1], "#### 5", {"answer": "#### 5", "ground_truth": "6", "task": "code"},
                CHAT, 9),
    ]


def _batch(texts=("<answer>5</answer>", "so 6", "five", "<answer>6</answer>"), state=None):
    # G = 2: completions 0, 1 belong to row 7, completions 2, 3 to row 9
    return reward_batch(_examples(), list(texts), 2, completion_ids=[[1, 2], [3], [4, 5, 6], []],
                        trainer_state=state or TrainerState(3, 10, 0.5))


# --- functions written as TRL's documentation writes them ---------------------------------------

def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def ground_truth_match(completions, ground_truth, **kwargs):
    return [1.0 if gt in completion else 0.0 for completion, gt in zip(completions, ground_truth)]


def token_count(completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]


def answer_tags(completions, **kwargs):  # conversational: each completion is a list of messages
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.fullmatch(r"<answer>.*</answer>", content) else 0.0 for content in contents]


def math_only(prompts, completions, task, **kwargs):
    return [1.0 if t == "math" else None for t in task]


def code_only(prompts, completions, task, **kwargs):
    return [0.5 if t == "code" else None for t in task]


async def slow_nonempty(prompts, completions, **kwargs):
    await asyncio.sleep(0.01)
    return [1.0 if completion else 0.0 for completion in completions]


def _all(conversational: bool):
    """The two rows both as text or both as conversations, G = 2."""
    rows = [replace(e, messages=CHAT if conversational else None) for e in _examples()]
    return reward_batch(rows, ["<answer>5</answer>", "so 6", "five", "<answer>6</answer>"], 2,
                        completion_ids=[[1, 2], [3], [4, 5, 6], []])


def test_trl_documentation_style_functions_run_unchanged():
    total, per_name = RewardSet([(reward_len, 1.0), (ground_truth_match, 1.0), (token_count, 0.0)]).score(
        _all(conversational=False))
    # len: "<answer>5</answer>" 18, "so 6" 4, "five" 4, "<answer>6</answer>" 18 -> -|20 - len|
    assert per_name["reward_len"] == [-2.0, -16.0, -16.0, -2.0]
    # ground_truth "5" for row 7's two completions, "6" for row 9's
    assert per_name["ground_truth_match"] == [1.0, 0.0, 0.0, 1.0]
    assert per_name["token_count"] == [2.0, 1.0, 3.0, 0.0]
    assert total == [-1.0, -16.0, -16.0, -1.0]  # token_count has weight 0
    _, per_name = RewardSet([(answer_tags, 1.0)]).score(_all(conversational=True))
    assert per_name["answer_tags"] == [1.0, 0.0, 0.0, 1.0]


def test_trl_form_gets_messages_for_a_conversational_row_and_every_field():
    seen = {}

    def spy(prompts, completions, completion_ids, trainer_state, **kwargs):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, state=trainer_state, kw=kwargs)
        return [0.0] * len(completions)

    RewardSet([(spy, 1.0)], group_size=2).score(_batch())
    assert seen["prompts"][:2] == ["What is 2 + 3?"] * 2 and seen["prompts"][2:] == [CHAT, CHAT]
    assert seen["completions"][:2] == ["<answer>5</answer>", "so 6"]
    assert seen["completions"][3] == [{"role": "assistant", "content": "<answer>6</answer>"}]
    assert seen["ids"] == [[1, 2], [3], [4, 5, 6], []]
    assert seen["state"] == TrainerState(global_step=3, max_steps=10, epoch=0.5)
    # every field but the prompt, repeated per completion; an integer answer as it is
    assert seen["kw"] == {"answer": [5, 5, "#### 5", "#### 5"], "ground_truth": ["5", "5", "6", "6"],
                          "task": ["math", "math", "code", "code"]}


def test_this_projects_form_gets_answers_positionally_and_fields_as_keywords():
    seen = {}

    def old(prompts, completions, answers, **kwargs):
        seen.update(prompts=prompts, answers=answers, kw=kwargs)
        return [1.0] * len(completions)

    def strict(prompts, completions, answers):  # no **kwargs: gets only what it names
        return [2.0] * len(completions)

    total, _ = RewardSet([(old, 1.0), (strict, 1.0)]).score(_batch())
    assert total == [3.0] * 4
    assert seen["prompts"] == ["What is 2 + 3?"] * 4  # text, the conversation's last user message
    assert seen["answers"] == [5, 5, "#### 5", "#### 5"]
    assert set(seen["kw"]) == {"answer", "ground_truth", "task", "completion_ids", "trainer_state"}


def test_the_builtin_correctness_reward_reads_an_integer_answer():
    _, per_name = RewardSet([("gsm8k_correctness", 1.0)]).score(_batch(("<answer>5.0</answer>", "5", "6", "5")))
    assert per_name["gsm8k_correctness"] == [1.0, 1.0, 0.0, 1.0]  # 5 == 5.0; "#### 5" as before


def test_none_is_left_out_of_the_sum_and_counted_in_the_metrics():
    from mlx_grpo.rollout.sample import Rollout
    from mlx_grpo.rollout.score import ScoredRollout, rollout_metrics

    rewards = RewardSet([(math_only, 1.0), (code_only, 2.0)], group_size=2)
    total, per_name = rewards.score(_batch())
    assert per_name == {"math_only": [1.0, 1.0, None, None], "code_only": [None, None, 0.5, 0.5]}
    assert total == [1.0, 1.0, 1.0, 1.0]  # 1 * 1.0 on math rows, 2 * 0.5 on code rows
    rollout = Rollout([[1]] * 4, [[2]] * 4, ["a"] * 4, [False] * 4, 2)
    m = rollout_metrics(ScoredRollout(rollout, total, per_name, ["q"] * 4), "group")
    assert m["rewards/math_only/mean"] == 1.0 and m["rewards/math_only/std"] == 0.0
    assert m["rewards/math_only/none_frac"] == 0.5 and m["rewards/code_only/none_frac"] == 0.5


def test_a_completion_no_reward_scores_is_one_line_naming_its_row():
    with pytest.raises(RewardError) as info:
        RewardSet([(math_only, 1.0)], group_size=2).score(_batch())
    message = str(info.value)
    assert "\n" not in message and message.startswith("no reward scored 2 of 4 completions")
    assert "sample 2 (prompt 1, data row 9, completion 'five')" in message


def test_async_rewards_are_awaited_together_also_inside_a_running_loop():
    rewards = RewardSet([(slow_nonempty, 1.0), (reward_len, 0.0)])
    assert rewards.score(_batch(("a", "", "b", "c")))[0] == [1.0, 0.0, 1.0, 1.0]

    async def in_a_notebook():  # asyncio.run cannot nest: the rewards run in a thread of their own
        return rewards.score(_batch(("", "x", "y", "z")))[0]

    assert asyncio.run(in_a_notebook()) == [0.0, 1.0, 1.0, 1.0]


def test_trainer_state_reaches_a_curriculum_reward():
    def curriculum(completions, trainer_state, **kwargs):
        return [trainer_state.global_step / trainer_state.max_steps] * len(completions)

    _, per_name = RewardSet([(curriculum, 1.0)]).score(_batch(state=TrainerState(5, 20, 1.25)))
    assert per_name["curriculum"] == [0.25] * 4


def test_reward_weights_replace_the_weights_as_in_trl():
    total, _ = RewardSet([(reward_len, 9.0), (ground_truth_match, 9.0)], weights=[0.5, 2.0]).score(_all(False))
    assert total == [1.0, -8.0, -8.0, 1.0]  # 0.5 * -2 + 2 * 1, 0.5 * -16 + 0, ...
    with pytest.raises(RewardError, match=r"^reward_weights: 3 weights for 2 rewards"):
        RewardSet([(reward_len, 1.0), (ground_truth_match, 1.0)], weights=[1.0, 1.0, 1.0])


def _bad(value):
    def bad(completions, **kwargs):
        return value(len(completions))
    return bad


@pytest.mark.parametrize(("out", "fragment"), [
    (lambda n: [1.0] * (n - 1), "'bad' returned 3 scores for 4 completions"),
    (lambda n: [1.0, 1.0, math.nan, 1.0], "'bad' gave nan (float) for sample 2 (prompt 1, data row 9"),
    (lambda n: [1.0, 1.0, 1.0, "1"], "'bad' gave '1' (str) for sample 3 (prompt 1, data row 9"),
    (lambda n: [1.0, 1 / 0, 1.0, 1.0], "'bad' raised ZeroDivisionError: division by zero on sample 0"),
])
def test_bad_output_is_one_line_naming_the_reward_and_the_row(out, fragment):
    with pytest.raises(RewardError) as info:
        RewardSet([(_bad(out), 1.0)], group_size=2).score(_batch())
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_a_raising_reward_names_the_data_row_of_the_completion_it_fails_on():
    def picky(completions, task, **kwargs):
        return [1.0 if t == "math" else {}["no score for code"] for t in task]

    with pytest.raises(RewardError, match=re.escape("raised KeyError: 'no score for code' on sample 2 (prompt 1, "
                                                    "data row 9, completion 'five')")):
        RewardSet([(picky, 1.0)], group_size=2).score(_batch())


def test_a_field_the_data_lacks_is_one_line_naming_the_fields_there_are():
    def wants_tests(completions, test_cases, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(RewardError) as info:
        RewardSet([(wants_tests, 1.0)]).score(_batch())
    message = str(info.value)
    assert message.startswith("reward 'wants_tests' cannot be called as fn(prompts=, completions=")
    assert "'test_cases'" in message and "the data's other fields: answer, ground_truth, task" in message


def test_reward_weights_in_a_profile_replace_the_entries_weights():
    from mlx_grpo.commands.setup import make_rewards
    from mlx_grpo.config import load_config

    rewards = make_rewards(load_config({"reward_weights": [2.0, 0.0]}))  # the default two rewards
    assert rewards.weights == {"gsm8k_correctness": 2.0, "xml_format": 0.0}


def test_a_run_hands_its_fields_to_the_rewards_and_logs_none(tmp_path):
    import mlx_grpo
    from mlx_grpo.run.log import read_jsonl, read_metrics

    rows = [{"question": f"What is {a} + 1?", "answer": a + 1, "kind": "odd" if a % 2 else "even"} for a in range(8)]
    seen = []

    def odd_rows_only(completions, kind, answer, trainer_state, **kwargs):
        seen.append((trainer_state.global_step, list(kind), list(answer)))
        return [1.0 if k == "odd" else None for k in kind]

    run = mlx_grpo.train("configs/smoke_test.toml", rewards=["gsm8k_correctness", odd_rows_only], dataset=rows,
                         output_dir=str(tmp_path / "run"), training={"max_steps": 2, "prompts_per_step": 2},
                         generation={"max_new_tokens": 8}, checkpoint={"save_every": 10})
    assert [step for step, _, _ in seen] == [0, 1]
    for _, kind, answer in seen:  # G = 4 completions per row, each with its row's fields
        assert len(kind) == 8 and kind[0::4] == kind[3::4] and all(isinstance(a, int) for a in answer)
    rows_logged = read_metrics(run)
    fractions = [sum(k == "even" for k in kind) / 8 for _, kind, _ in seen]
    assert [r["rewards/odd_rows_only/none_frac"] for r in rows_logged] == fractions
    sample = read_jsonl(run / "completions.jsonl")[0]
    assert sample["rewards"]["odd_rows_only"] in (1.0, None)


def test_eval_reads_number_answers_as_gsm8k_references():
    from mlx_grpo.commands.evaluate import accuracy_metrics, is_gsm8k_style

    assert is_gsm8k_style([5, 2.5, "#### 3"]) and not is_gsm8k_style(["five"]) and not is_gsm8k_style([[5]])
    assert accuracy_metrics(["<answer>5</answer>", "<answer>2</answer>"], [5, 2.5])["accuracy"] == 0.5
