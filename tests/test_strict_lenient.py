"""GSM8K accuracy under four readings, by hand and on the shipped GSM8K rows: the correctness
reward's, the format-aware one, and lm-evaluation-harness's strict-match and flexible-extract."""

import json

import pytest

from mlx_grpo.commands.evaluate import EvalSettings, evaluate, format_table, load_eval_examples
from mlx_grpo.rewards.task_metrics import accuracy_metrics
from mlx_grpo.config import load_config
from mlx_grpo.rewards import (
    RewardSet, extract_strict_number, lm_eval_exact_match, lm_eval_flexible_extract, lm_eval_strict_match,
)

# completion -> accuracy (the reward's reading), format, strict, lenient; the reference is "#### 42".
# lm-eval's columns worked by hand from gsm8k.yaml: strict-match = findall(r"#### (\-?[0-9\.\,]+)")[0],
# flexible-extract = findall(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")[-1] (its non-empty group), either
# "[invalid]" without a match; then remove ",", "$", r"(?s).*#### ", r"\.$" from both sides and
# compare lower-cased strings (the reference "#### 42" becomes "42").
CASES = [
    # no "#### " -> strict "[invalid]"; flexible's matches 6, 7, 42, 42 -> "42"
    ("<reasoning>\n6 * 7 = 42\n</reasoning>\n<answer>\n42\n</answer>", 1, 1, 0, 1),
    ("<answer>The answer is 42</answer>", 1, 0, 0, 1),  # the tag holds more than the number
    ("<answer>42</answer> or maybe 7", 1, 1, 0, 0),  # flexible's last match is "7"
    ("so it is 42", 1, 0, 0, 1),  # no format at all
    ("6 * 7 = 42\n#### 42", 1, 1, 1, 1),  # GSM8K's own format
    # an answer tag and a ####: the tag wins for ours (41); strict reads "#### 42" -> "42", flexible "42"
    ("<answer>41</answer>\n#### 42", 0, 0, 1, 1),
    # two ####: ours take the last (42); strict takes the FIRST match, "41"; flexible the last, "42"
    ("#### 41\nNo: #### 42", 1, 1, 0, 1),
    # "42.0": ours compare numbers (42.0 = 42); lm-eval compares strings, "42.0" != "42"
    ("#### 42.0", 1, 1, 0, 0),
    ("#### 42.", 1, 1, 1, 1),  # "42." loses its final "." to r"\.$" -> "42"
    # "$": strict's pattern wants a digit, "-", "." or "," right after "#### " -> "[invalid]";
    # flexible matches "$42" and "$" is ignored -> "42"
    ("#### $42", 1, 1, 0, 1),
    # flexible's last match is "42..." (2+ of "$0-9.,"); r"\.$" takes one "." -> "42.." != "42"
    ("The answer is 42...", 1, 0, 0, 0),
    ("", 0, 0, 0, 0),  # "[invalid]" != "42"
    # repeated tags, as a policy that wore its format down writes: the first tag runs to the last
    ("<answer>\n42\n</reasoning>\n<answer>\n42\n</answer>", 1, 0, 0, 1),
]
KEYS = ("accuracy", "accuracy_format", "accuracy_strict", "accuracy_lenient")


def test_readings_by_hand():
    assert extract_strict_number("<answer>\n $1,000. \n</answer>") == "1000"
    assert extract_strict_number("x\n#### $1,000.") == "1000"
    assert extract_strict_number("<answer>x = 5</answer>") is None and extract_strict_number("5") is None
    got = accuracy_metrics([c for c, *_ in CASES], ["#### 42"] * len(CASES))
    # over the 13 rows: accuracy 11 (all but rows 6 and 12), format 7 (rows 1, 3, 5, 7-10),
    # strict 3 (rows 5, 6, 9), lenient 9 (rows 1, 2, 4-7, 9, 10, 13)
    assert got == {"accuracy": pytest.approx(11 / 13), "accuracy_format": pytest.approx(7 / 13),
                   "accuracy_strict": pytest.approx(3 / 13), "accuracy_lenient": pytest.approx(9 / 13)}
    for completion, *expected in CASES:
        assert list(accuracy_metrics([completion], ["#### 42"]).values()) == expected, completion


def test_lm_eval_filters_and_exact_match_by_hand():
    # strict-match: the first "#### N" whose N starts right after the space; commas kept until exact_match
    assert lm_eval_strict_match("x #### 1,000 and #### 5") == "1,000"
    assert lm_eval_strict_match("#### $1,000") == "[invalid]" and lm_eval_strict_match("####1000") == "[invalid]"
    assert lm_eval_strict_match("#### -3.5\n") == "-3.5"
    # flexible-extract: the last match; a tuple's non-empty group. "10-5": "10" (group 1), then "-5"
    # (group 1 needs 2 characters after the "-", so group 2)
    assert lm_eval_flexible_extract("10-5") == "-5"
    assert lm_eval_flexible_extract("costs $1,000.") == "$1,000."
    assert lm_eval_flexible_extract("3 + 4 = 7\n") == "7" and lm_eval_flexible_extract("hmm...") == "..."
    assert lm_eval_flexible_extract("no digits") == "[invalid]"
    # exact_match: "$1,000." -> (",") "$1000." -> ("$") "1000." -> (".*#### ") "1000." -> (r"\.$") "1000";
    # the reference "Janet ...\n#### 1000" -> "1000"
    assert lm_eval_exact_match("$1,000.", "Janet sells 1,000 eggs.\n#### 1000")
    assert lm_eval_exact_match("1,000", "#### 1000") and not lm_eval_exact_match("1000.0", "#### 1000")
    assert not lm_eval_exact_match("[invalid]", "#### 42")
    # (?s).*#### is greedy: everything up to the LAST "#### " of the reference goes
    assert lm_eval_exact_match("7", "a #### 5\nb\n#### 7")


@pytest.mark.parametrize("path", ["data/gsm8k_test.jsonl", "data/gsm8k_train.jsonl"])
def test_reference_solutions_score_one_on_the_shipped_rows(path):
    rows = [json.loads(line) for line in open(path)]
    answers = [r["answer"] for r in rows]
    assert len(rows) == 200
    assert accuracy_metrics(answers, answers) == dict.fromkeys(KEYS, 1.0)
    # The same solutions with "#### N" written as prose: right by the last number ("N." loses its
    # "." in lm-eval's exact_match), not in the format, and no "#### N" for strict-match.
    prose = [a.rsplit("####", 1)[0] + "The answer is " + a.rsplit("####", 1)[1].strip() + "." for a in answers]
    assert accuracy_metrics(prose, answers) == {"accuracy": 1.0, "accuracy_format": 0.0, "accuracy_strict": 0.0,
                                                "accuracy_lenient": 1.0}


def test_evaluate_reports_all_four_side_by_side(tiny):
    model, tokenizer = tiny
    cfg = load_config("configs/smoke_test.toml")
    examples = load_eval_examples(cfg, tokenizer, "test", limit=6)
    result = evaluate(model, tokenizer, examples, RewardSet.from_config(cfg.rewards),
                      EvalSettings(max_new_tokens=32, batch_size=6), progress=False)
    m = result["metrics"]
    greedy = [s["completion"] for s in result["samples"]]
    assert {k: m[k] for k in KEYS} == accuracy_metrics(greedy, [e.answer for e in examples])
    assert [list(m).index(k) for k in KEYS] == list(range(list(m).index("accuracy"), list(m).index("accuracy") + 4))
    table = format_table(m)
    assert all(k in table for k in KEYS)


def test_training_eval_logs_and_prints_them(tmp_path, capsys):
    from mlx_grpo.commands.train import train
    from mlx_grpo.run.log import read_metrics

    cfg = load_config("configs/smoke_test.toml", [
        "training.max_steps=1", "training.prompts_per_step=2", "generation.max_new_tokens=16",
        "eval.every=1", "eval.limit=3", f'output_dir="{tmp_path / "run"}"',
    ])
    train(cfg)
    row = read_metrics(cfg.output_dir)[0]
    assert {f"eval/{k}" for k in KEYS} <= set(row)
    out = " ".join(capsys.readouterr().out.split())  # the eval line may wrap past 99 columns
    line = out[out.index("step 1 eval | prompts 3"):]
    for key in KEYS[1:]:
        assert f" {key} {row[f'eval/{key}']:.3f}" in line
