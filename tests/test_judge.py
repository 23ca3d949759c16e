"""The judge reward: a local model scores completions. Its reading of answers (a number, a
ranking, yes/no), the cache, unparsable answers (None, a counted warning) and template fields on
a stand-in judge; loading, batching and yes/no log-probs on builtin:tiny; its config keys, its
share of a training step and its phases in `plan`."""

import math
import re

import pytest

from mlx_grpo.config import ConfigError, RewardConfig, load_config
from mlx_grpo.judge import JudgeReward, make_judge, rank_scores
from mlx_grpo.rewards import RewardError, RewardSet


class StandIn:
    """A judge whose answer to a request is `reply(request)`; it records what it was asked."""

    def __init__(self, reply):
        self.reply, self.asked = reply, []

    def encode(self, request):
        return request  # opaque to JudgeReward: handed back to answers()

    def answers(self, prompts, max_new_tokens, batch_size):
        self.asked.append(list(prompts))
        return [self.reply(p) for p in prompts]

    def yes_no_tokens(self):
        return [1], [2]


def _judge(reply, warnings=None, **kw):
    stand_in = StandIn(reply)
    return JudgeReward(stand_in, warn=(warnings if warnings is not None else []).append, **kw), stand_in


def test_a_number_answer_is_the_score_and_identical_requests_are_asked_once():
    judge, stand_in = _judge(lambda r: f"<reasoning>1 + 2</reasoning><answer>{len(r) % 7}</answer>",
                             template="Q: {prompt} A: {completion} ({level})")
    prompts, completions = ["p", "p", "p", "q"], ["a", "a", "bb", "a"]
    scores = judge(prompts, completions, [None] * 4, level=["x", "x", "x", "y"])
    # requests "Q: p A: a (x)" (13 chars, twice), "Q: p A: bb (x)" (14), "Q: q A: a (y)" (13): len % 7
    assert scores == [6.0, 6.0, 0.0, 6.0]
    assert stand_in.asked == [["Q: p A: a (x)", "Q: p A: bb (x)", "Q: q A: a (y)"]]  # one batch, no repeat
    judge(["p"], ["a"], [None], level=["x"])  # asked before: from the cache
    m = judge.take_metrics()
    assert (m["judge/requests"], m["judge/cache_hits"], m["judge/unparsed"]) == (5.0, 2.0, 0.0)
    assert len(stand_in.asked) == 1 and m["time/judge"] > 0
    assert judge.take_metrics()["judge/requests"] == 0.0  # the counters start again


def test_an_unparsable_answer_scores_none_and_is_warned_about_once_and_counted():
    warnings = []
    judge, _ = _judge(lambda r: "no idea" if "bad" in r else "7", warnings, template="{completion}")
    assert judge(["p"] * 3, ["good", "bad", "bad too"], [None] * 3) == [7.0, None, None]
    assert judge(["p"], ["bad again"], [None]) == [None]
    assert len(warnings) == 1 and "the judge gave no score for 2 of 3 completions" in warnings[0]
    assert "'no idea'" in warnings[0] and judge.take_metrics()["judge/unparsed"] == 3.0


def test_a_run_goes_on_when_the_judge_scores_nothing_for_a_row_another_reward_scores():
    judge, _ = _judge(lambda r: "?", template="{completion}")
    total, per_name = RewardSet([(judge, 1.0), ("xml_format", 1.0)])(["p", "p"], ["a", "b"], [None] * 2)
    assert per_name["judge"] == [None, None] and total == [0.0, 0.0]


def test_a_completion_only_the_judge_could_score_takes_its_groups_mean_total():
    judge, _ = _judge(lambda r: "?" if "b" in r else "4", template="{completion}")
    total, per_name = RewardSet([(judge, 0.5)], group_size=2)(["p"] * 4, ["a", "b", "b", "bb"], [None] * 4)
    assert per_name["judge"] == [4.0, None, None, None]
    # group 1: "a" 0.5 * 4 = 2.0, "b" the mean of its group's scored totals, 2.0; group 2: none scored, 0.0
    assert total == [2.0, 2.0, 0.0, 0.0]


@pytest.mark.parametrize(("reply", "scores"), [
    ("2, 3, 1", [0.0, 1.0, 0.5]),  # [2] best (1), [3] next (0.5), [1] worst (0)
    ("[3] > [1] > [2] because 3 is best", [0.5, 0.0, 1.0]),  # repeats and numbers past G skipped
    ("2, 3", [None, None, None]),  # not a whole ranking
    ("", [None, None, None]),
])
def test_a_ranking_of_a_group_scores_its_completions_from_1_to_0(reply, scores):
    assert rank_scores(reply, 3) == scores


def test_group_mode_asks_once_per_prompt_with_its_numbered_completions():
    judge, stand_in = _judge(lambda r: "2, 1", mode="group", group_size=2, template="{prompt}\n{completions}")
    assert judge(["p", "p", "q", "q"], ["a", "b", "c", "d"], [None] * 4) == [0.0, 1.0, 0.0, 1.0]
    assert stand_in.asked == [["p\n[1] a\n\n[2] b", "q\n[1] c\n\n[2] d"]]


@pytest.mark.parametrize(("template", "mode", "message"), [
    ("{completions}", "single", r"^rewards\[1\].template: \{completions\} is not a field in mode = 'single'"),
    ("{completion}", "group", r"^rewards\[1\].template: \{completion\} is not a field in mode = 'group'"),
])
def test_a_template_field_of_the_other_mode_stops_before_any_step(template, mode, message):
    with pytest.raises(RewardError, match=message):
        _judge(lambda r: "1", template=template, mode=mode, setting="rewards[1]")


def test_a_template_naming_a_field_the_data_lacks_is_one_line():
    judge, _ = _judge(lambda r: "1", template="{prompt} {rubric}", setting="rewards[1]")
    with pytest.raises(RewardError, match=r"rewards\[1\].template names \{rubric\}, which is no field here "
                                          r"\(fields: answer, completion, level, prompt\)"):
        judge(["p"], ["c"], [None], level=["x"])


# --- the config ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("rewards", "message"), [
    ([{"name": "judge"}], r"rewards\[0\].model: the judge reward needs a model"),
    ([{"name": "xml_format", "template": "{completion}"}], r"rewards\[0\].template: only the judge reward"),
    ([{"name": "judge", "model": "builtin:tiny", "mode": "group", "parse": "yes_no"}],
     r"rewards\[0\].parse: mode = \"group\" reads a ranking"),
    ([{"name": "judge", "model": "builtin:tiny", "parse": "score"}], r"rewards\[0\].parse must be one of 'number'"),
])
def test_the_judges_keys_are_checked_when_the_config_loads(rewards, message):
    with pytest.raises(ConfigError, match=message):
        load_config({"rewards": rewards})


# --- on builtin:tiny -----------------------------------------------------------------------------

QUESTIONS = ["What is 2 + 3?", "What is 4 + 1?", "What is 2 + 3?", "What is 7 - 2?"]


def test_a_tiny_judge_answers_in_one_batch_and_its_number_is_the_score():
    judge = make_judge(RewardConfig("judge", model="builtin:tiny", template="{prompt}"), "float32", 2, "rewards[0]")
    scores = judge(QUESTIONS, ["x"] * 4, [None] * 4)
    # the score is the number its own greedy answer holds (whatever tiny computes on this float path)
    model = judge.judge
    direct = model.answers([model.encode(q) for q in dict.fromkeys(QUESTIONS)], 64, 16)
    from mlx_grpo.rewards import extract_predicted_number

    expected = [float(extract_predicted_number(direct[i])) for i in (0, 1, 0, 2)]
    assert scores == expected and all(isinstance(s, float) for s in scores)
    assert judge.take_metrics()["judge/cache_hits"] == 1.0  # the repeated question


def test_a_tiny_judge_cut_at_one_token_gives_none_with_a_warning():
    warnings = []
    judge = JudgeReward(make_judge(RewardConfig("judge", model="builtin:tiny"), "float32", 1, "r").judge,
                        max_new_tokens=1, warn=warnings.append)
    assert judge(QUESTIONS[:2], ["5", "5"], [None] * 2) == [None, None]  # one token: '<', no number
    assert len(warnings) == 1 and judge.take_metrics()["judge/unparsed"] == 2.0


def test_a_tiny_judges_yes_no_is_a_probability_from_its_next_token():
    judge = make_judge(RewardConfig("judge", model="builtin:tiny", parse="yes_no"), "float32", 1, "rewards[0]")
    yes, no = judge.judge.yes_no_tokens()
    assert yes == [59, 91] and no == [48, 80]  # the tokenizer's 'Y', 'y' and 'N', 'n' (' yes' starts with ' ')
    scores = judge(QUESTIONS, ["5", "5", "5", "5"], [None] * 4)
    assert all(0.0 <= s <= 1.0 for s in scores) and scores[0] == scores[2]


def test_a_judge_model_that_cannot_load_is_one_line_naming_its_key(tmp_path):
    from mlx_grpo.commands.setup import make_rewards
    from mlx_grpo.errors import ModelError

    cfg = load_config({"rewards": [{"name": "xml_format"}, {"name": "judge", "model": str(tmp_path / "none")}]})
    with pytest.raises(ModelError, match=r"^rewards\[1\].model: folder '.*none' does not exist$"):
        make_rewards(cfg)


def test_a_run_with_a_tiny_judge_logs_its_share_of_the_step(tmp_path, capsys):
    from mlx_grpo.commands.train import train
    from mlx_grpo.run.log import read_metrics

    cfg = load_config("configs/smoke_test.toml", [
        "training.max_steps=2", "training.prompts_per_step=2", "generation.max_new_tokens=16",
        'rewards=[{name="gsm8k_correctness"}, {name="judge", model="builtin:tiny", parse="yes_no", weight=0.5}]',
        f'output_dir="{tmp_path / "run"}"', "checkpoint.save_every=10",
    ])
    train(cfg)
    rows = read_metrics(cfg.output_dir)
    for row in rows:
        assert row["judge/requests"] == 8.0 and 0 <= row["rewards/judge/mean"] <= 1  # 2 prompts x G = 4
        assert 0 < row["time/judge"] <= row["time/rewards"] < row["step_time"]
        assert 0 < row["judge/peak_memory_gb"] <= row["peak_memory_gb"] and "judge/peak_before_gb" not in row
    assert re.search(r"\| judging \d+\.\d\ds", capsys.readouterr().out)  # on the step's console line


def test_a_run_whose_judge_gives_no_score_counts_it_in_the_end_of_run_warnings(tmp_path, capsys):
    """A judge cut at one token scores nothing: the warning printed at step 1 is counted in the
    summary's warnings and named at the end, as the live warnings are (it read '0 warnings')."""
    from mlx_grpo.commands.train import train
    from mlx_grpo.run.log import read_metrics

    cfg = load_config("configs/smoke_test.toml", [
        "training.max_steps=2", "training.prompts_per_step=2", "generation.max_new_tokens=16",
        'rewards=[{name="gsm8k_correctness"}, {name="judge", model="builtin:tiny", max_new_tokens=1}]',
        f'output_dir="{tmp_path / "run"}"', "checkpoint.save_every=10", "logging.log_completions=0",
    ])
    train(cfg)
    rows = read_metrics(cfg.output_dir)
    assert [r["judge/unparsed"] for r in rows] == [8.0, 8.0]  # 2 prompts x G = 4, every reply unread
    from checks import unwrap

    lines = unwrap(capsys.readouterr().out)  # the console's lines, continuations joined back on
    assert sum(line.startswith("mlx-grpo: warning: the judge gave no score") for line in lines) == 1  # once
    assert "mlx-grpo: the judge gave no score for 16 completions in 2 steps (judge/unparsed)" in lines
    # 16-token completions also trip length_cap and truncated_rewarded at both steps: 2 + 2 + the judge's 2
    assert "mlx-grpo: warnings this run: length_cap x2 (first at step 1)" in lines
    assert "mlx-grpo: tripwires this run: truncated_rewarded x2 (first at step 1)" in lines
    assert any(line.startswith("mlx-grpo: done after step 2 of 2,") and line.endswith(", 6 warnings")
               for line in lines), "\n".join(lines)
    assert "mlx-grpo:   judge scored no completion (None for every one)" in lines


def test_plan_holds_the_judges_weights_and_kv_cache_as_a_phase():
    from mlx_grpo.commands.plan import plan

    base = ["training.prompts_per_step=2", "generation.max_new_tokens=16", "data.max_prompt_tokens=100"]
    judged = plan(load_config("configs/smoke_test.toml", base + [
        'rewards=[{name="judge", model="builtin:tiny", template="{prompt}{completion}", batch_size=4}]']))
    alone = plan(load_config("configs/smoke_test.toml", base))
    p = judged["phases_gb"]
    assert p["judge weights"] == p["weights"]  # tiny judges tiny, both float32
    # KV: 4 requests x (20 template chars + 100 prompt + 16 completion + 64 answer = 200 -> 256 slots)
    # x 4 layers x 2 KV heads x 32 dims x 2 (keys, values) x 4 bytes
    assert p["judge KV cache"] == pytest.approx(4 * 256 * 4 * 2 * 32 * 2 * 4 / 1e9)
    assert p["judging"] == pytest.approx(p["weights"] + p["optimizer state"] + p["judge weights"] + p["judge KV cache"])
    assert p["update"] == pytest.approx(alone["phases_gb"]["update"] + p["judge weights"])
    assert "judging" not in alone["phases_gb"] and math.isclose(judged["peak_gb"], p["update"])


def test_the_judge_by_name_alone_says_it_needs_its_entry():
    with pytest.raises(RewardError, match=r"^reward 'judge' is configured by its \[\[rewards\]\] entry"):
        RewardSet([("judge", 1.0)])


def test_a_quantized_mlx_folder_judges_and_plan_counts_its_packed_weights(tmp_path):
    from mlx_grpo.commands.plan import plan
    from mlx_grpo.models.load import quiet_convert

    folder = str(tmp_path / "tiny-q4")
    quiet_convert("mlx_grpo/builtin/tiny", mlx_path=folder, quantize=True, q_bits=4, q_group_size=64)
    judge = make_judge(RewardConfig("judge", model=folder, parse="yes_no"), "float32", 1, "rewards[0]")
    assert all(0.0 <= s <= 1.0 for s in judge(QUESTIONS[:2], ["5", "6"], [None] * 2))
    phases = plan(load_config({"rewards": [{"name": "judge", "model": folder}]}))["phases_gb"]
    assert 0 < phases["judge weights"] < phases["weights"] / 4  # 4-bit against the policy's float32
