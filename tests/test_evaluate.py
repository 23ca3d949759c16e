"""eval: task metrics against hand-computed values, the command, and [eval] during training."""

import json
from pathlib import Path

import pytest

from mlx_grpo.cli import main
from mlx_grpo.config import load_config
from mlx_grpo.evaluate import (
    EvalSettings, evaluate, format_table, is_gsm8k_style, load_eval_examples, number_metrics, rouge_metrics,
)
from mlx_grpo.log import read_metrics
from mlx_grpo.rewards import RewardSet
from mlx_grpo.train import train

SMOKE = "configs/smoke_test.toml"
TIMING = {"step_time", "tokens_per_second", "peak_memory_gb"}


def test_maj_and_pass_at_k_by_hand():
    samples = [
        ["<answer>5</answer>", "so 5.0", "3"],  # votes 5, 5, 3: majority 5 = reference
        ["2", "2", "<answer>7</answer>"],  # votes 2, 2, 7: majority 2 is wrong, one sample is right
        ["no number", "4", "6"],  # votes 4, 6: a tie goes to the first sampled, 4; 6 is right
        ["none", "at all", "here"],  # no votes: wrong for both
    ]
    answers = ["x\n#### 5", "#### 7", "#### 6", "#### 1"]
    # maj@3 = (1 + 0 + 0 + 0) / 4; pass@3 = (1 + 1 + 1 + 0) / 4
    assert number_metrics(samples, answers) == {"maj@3": 0.25, "pass@3": 0.75}
    assert number_metrics([[s[0]] for s in samples], answers) == {"maj@1": 0.25, "pass@1": 0.25}


def test_rouge_by_hand():
    # "the cat sat" vs "the cat sat on the mat": unigrams P = 3/3, R = 3/6, F = 2/3;
    # bigrams (the cat, cat sat) P = 2/2, R = 2/5, F = 2 * 0.4 / 1.4 = 4/7; LCS = 3 words, F = 2/3.
    got = rouge_metrics(["the cat sat"], ["the cat sat on the mat"])
    assert got == pytest.approx({"rouge1": 2 / 3, "rouge2": 4 / 7, "rougeL": 2 / 3})


def test_gsm8k_style_needs_every_answer_to_end_in_a_number():
    assert is_gsm8k_style(["a\n#### 5", "#### 1,000"])
    assert not is_gsm8k_style(["a\n#### 5", "a summary"])
    assert not is_gsm8k_style(["#### five"]) and not is_gsm8k_style([])


def test_evaluate_tiny_accuracy_matches_the_correctness_reward(tiny):
    model, tokenizer = tiny
    cfg = load_config(SMOKE)
    examples = load_eval_examples(cfg, tokenizer, "test", limit=6)
    assert len(examples) == 6 and len({e.question for e in examples}) == 6
    result = evaluate(model, tokenizer, examples, RewardSet.from_config(cfg.rewards),
                      EvalSettings(num_samples=3, max_new_tokens=32, batch_size=4), progress=False)
    m = result["metrics"]
    right = sum(s["rewards"]["gsm8k_correctness"] for s in result["samples"])
    assert m["accuracy"] == m["rewards/gsm8k_correctness/mean"] == right / 6
    assert m["reward"] == pytest.approx(m["rewards/gsm8k_correctness/mean"] + 0.5 * m["rewards/xml_format/mean"])
    assert 0.0 <= m["maj@3"] <= m["pass@3"] <= 1.0
    assert all(len(s["samples"]) == 3 for s in result["samples"])
    assert "accuracy" in format_table(m).splitlines()[3]


def test_eval_command_on_a_summary_set_reports_rouge(tmp_path, capsys):
    data = tmp_path / "summaries.jsonl"
    rows = [{"question": f"Summarize: the value is {i} and it is fine.", "answer": f"the value is {i}"} for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    profile = tmp_path / "sum.toml"
    profile.write_text(f'[data]\ndataset = "{data}"\nsplit = "train"\n\n'
                       '[[rewards]]\nname = "rouge_l"\n\n[[rewards]]\nname = "xml_format"\nweight = 0.0\n')
    out = tmp_path / "e.json"
    assert main(["eval", "--config", str(profile), "--split", "train", "--max-tokens", "16", "--json", str(out)]) == 0
    m = json.loads(out.read_text())["metrics"]
    assert "accuracy" not in m and m["num_prompts"] == 3
    assert set(m) >= {"rouge1", "rouge2", "rougeL", "rewards/rouge_l/mean", "rewards/xml_format/mean"}
    assert m["rougeL"] == pytest.approx(m["rewards/rouge_l/mean"])  # the same ROUGE-L, stemmed
    assert m["reward"] == pytest.approx(m["rewards/rouge_l/mean"])  # xml_format has weight 0
    assert "rougeL" in capsys.readouterr().out


def test_eval_command_on_a_run_writes_json_into_the_run(lora_run, capsys):
    assert main(["eval", "--model", str(lora_run), "--limit", "4", "--max-tokens", "32"]) == 0
    written = lora_run / "eval_test_step_000002.json"
    result = json.loads(written.read_text())
    assert result["split"] == "test" and result["metrics"]["num_prompts"] == 4 and len(result["samples"]) == 4
    table = capsys.readouterr().out
    assert "accuracy" in table and str(written) in table


def test_eval_of_the_configured_base_writes_into_the_working_directory(tmp_path, monkeypatch, capsys):
    profile = str(Path(SMOKE).resolve())
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--config", profile, "--limit", "3", "--max-tokens", "32"]) == 0
    result = json.loads((tmp_path / "eval_test.json").read_text())
    assert result["model"] == "builtin:tiny" and result["metrics"]["num_prompts"] == 3
    assert result["max_new_tokens"] == 32 and "accuracy" in capsys.readouterr().out


def test_eval_without_config_or_run_is_one_line_error(capsys):
    assert main(["eval", "--model", "builtin:tiny"]) == 2
    assert "give --config FILE" in capsys.readouterr().err


def test_eval_during_training_logs_eval_metrics_and_changes_nothing_else(tmp_path):
    fast = ["training.max_steps=2", "training.prompts_per_step=2", "generation.max_new_tokens=24",
            "checkpoint.save_every=10", "training.learning_rate=1e-3"]
    runs = []
    for name, extra in (("plain", []), ("eval", ["eval.every=2", "eval.limit=3"])):
        cfg = load_config(SMOKE, fast + [f'output_dir="{tmp_path / name}"', *extra])
        train(cfg)
        runs.append(read_metrics(cfg.output_dir))
    plain, with_eval = runs
    assert "eval/accuracy" not in with_eval[0]
    last = with_eval[1]
    assert last["eval/num_prompts"] == 3 and 0.0 <= last["eval/accuracy"] <= 1.0
    assert {"eval/reward", "eval/rewards/gsm8k_correctness/mean", "eval/rewards/xml_format/mean"} <= set(last)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING and not k.startswith("eval/")} for r in rows]
    assert strip(plain) == strip(with_eval)  # greedy eval draws no random numbers


def test_eval_config_keys_are_checked():
    from mlx_grpo.config import ConfigError

    with pytest.raises(ConfigError, match=r"eval.num_samples must be >= 1, got 0"):
        load_config(SMOKE, ["eval.num_samples=0"])
    with pytest.raises(ConfigError, match=r"unknown key 'eval.evrey' \(did you mean 'eval.every'\?\)"):
        load_config(SMOKE, ["eval.evrey=5"])
