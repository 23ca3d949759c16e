"""Strict and lenient GSM8K accuracy beside the correctness reward's reading, by hand and on the
shipped GSM8K rows."""

import json

import pytest

from mlx_grpo.commands.evaluate import EvalSettings, accuracy_metrics, evaluate, format_table, load_eval_examples
from mlx_grpo.config import load_config
from mlx_grpo.rewards import RewardSet, extract_last_number, extract_strict_number

CASES = [  # completion, accuracy (the reward's reading), strict, lenient; the reference is 42
    ("<reasoning>\n6 * 7 = 42\n</reasoning>\n<answer>\n42\n</answer>", 1, 1, 1),
    ("<answer>The answer is 42</answer>", 1, 0, 1),  # the tag holds more than the number
    ("<answer>42</answer> or maybe 7", 1, 1, 0),  # a number after the tag
    ("so it is 42", 1, 0, 1),  # no format at all
    ("6 * 7 = 42\n#### 42", 1, 1, 1),  # GSM8K's own format
    ("<answer>41</answer>\n#### 42", 0, 0, 1),  # the tag wins over ####
    ("", 0, 0, 0),
    # repeated tags, as a policy that wore its format down writes: the first tag runs to the last
    ("<answer>\n42\n</reasoning>\n<answer>\n42\n</answer>", 1, 0, 1),
]


def test_readings_by_hand():
    assert extract_strict_number("<answer>\n $1,000. \n</answer>") == "1000"
    assert extract_strict_number("x\n#### $1,000.") == "1000"
    assert extract_strict_number("<answer>x = 5</answer>") is None and extract_strict_number("5") is None
    assert extract_last_number("a 3, then 10-5 and -2.50") == "-2.50"
    got = accuracy_metrics([c for c, *_ in CASES], ["#### 42"] * len(CASES))
    # accuracy 6/8 (cases 1-5, 8), strict 3/8 (1, 3, 5), lenient 6/8 (1, 2, 4, 5, 6, 8)
    assert got == {"accuracy": pytest.approx(6 / 8), "accuracy_strict": pytest.approx(3 / 8),
                   "accuracy_lenient": pytest.approx(6 / 8)}
    for completion, *expected in CASES:
        assert list(accuracy_metrics([completion], ["#### 42"]).values()) == expected, completion


@pytest.mark.parametrize("path", ["data/gsm8k_test.jsonl", "data/gsm8k_train.jsonl"])
def test_reference_solutions_score_one_on_the_shipped_rows(path):
    rows = [json.loads(line) for line in open(path)]
    answers = [r["answer"] for r in rows]
    assert len(rows) == 200
    assert accuracy_metrics(answers, answers) == {"accuracy": 1.0, "accuracy_strict": 1.0, "accuracy_lenient": 1.0}
    # The same solutions with "#### N" written as prose: right by the last number, not in the format.
    prose = [a.rsplit("####", 1)[0] + "The answer is " + a.rsplit("####", 1)[1].strip() + "." for a in answers]
    assert accuracy_metrics(prose, answers) == {"accuracy": 1.0, "accuracy_strict": 0.0, "accuracy_lenient": 1.0}


def test_evaluate_reports_all_three_side_by_side(tiny):
    model, tokenizer = tiny
    cfg = load_config("configs/smoke_test.toml")
    examples = load_eval_examples(cfg, tokenizer, "test", limit=6)
    result = evaluate(model, tokenizer, examples, RewardSet.from_config(cfg.rewards),
                      EvalSettings(max_new_tokens=32, batch_size=6), progress=False)
    m = result["metrics"]
    greedy = [s["completion"] for s in result["samples"]]
    assert {k: m[k] for k in ("accuracy", "accuracy_strict", "accuracy_lenient")} == accuracy_metrics(
        greedy, [e.answer for e in examples])
    assert list(m).index("accuracy_strict") == list(m).index("accuracy") + 1
    table = format_table(m)
    assert "accuracy_strict" in table and "accuracy_lenient" in table


def test_training_eval_logs_and_prints_both(tmp_path, capsys):
    from mlx_grpo.commands.train import train
    from mlx_grpo.run.log import read_metrics

    cfg = load_config("configs/smoke_test.toml", [
        "training.max_steps=1", "training.prompts_per_step=2", "generation.max_new_tokens=16",
        "eval.every=1", "eval.limit=3", f'output_dir="{tmp_path / "run"}"',
    ])
    train(cfg)
    row = read_metrics(cfg.output_dir)[0]
    assert {"eval/accuracy", "eval/accuracy_strict", "eval/accuracy_lenient"} <= set(row)
    out = " ".join(capsys.readouterr().out.split())  # the eval line may wrap past 99 columns
    line = out[out.index("step 1 eval | prompts 3"):]
    assert f" accuracy_strict {row['eval/accuracy_strict']:.3f}" in line
    assert f" accuracy_lenient {row['eval/accuracy_lenient']:.3f}" in line
