"""eval: task metrics against hand-computed values, the command, and [eval] during training."""

import json
import math
import re
from pathlib import Path

import mlx.core as mx
import pytest

from mlx_grpo.cli import main
from mlx_grpo.config import load_config
from mlx_grpo.commands.evaluate import EvalSettings, evaluate, format_table, load_eval_examples, make_training_eval
from mlx_grpo.rewards.task_metrics import is_gsm8k_style, number_metrics, rouge_metrics
from mlx_grpo.run.log import read_metrics
from mlx_grpo.rewards import RewardSet
from mlx_grpo.commands.train import train

SMOKE = "configs/smoke_test.toml"
TIMING = {"step_time", "tokens_per_second", "peak_memory_gb", "time/rewards"}


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
    # standard errors over the 6 prompts: sqrt(p (1 - p) / 6); the reward's population std / sqrt(6)
    p = right / 6
    assert m["accuracy_stderr"] == pytest.approx(math.sqrt(p * (1 - p) / 6), rel=1e-9)
    totals = [s["rewards"]["gsm8k_correctness"] + 0.5 * s["rewards"]["xml_format"] for s in result["samples"]]
    mean = sum(totals) / 6
    assert m["reward_stderr"] == pytest.approx(math.sqrt(sum((t - mean) ** 2 for t in totals) / 6) / math.sqrt(6))
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
    # Again, with fewer prompts: the first result stays, the second gets the next free name.
    assert main(["eval", "--model", str(lora_run), "--limit", "2", "--max-tokens", "32"]) == 0
    assert json.loads(written.read_text())["metrics"]["num_prompts"] == 4
    second = lora_run / "eval_test_step_000002_2.json"
    assert json.loads(second.read_text())["metrics"]["num_prompts"] == 2 and str(second) in capsys.readouterr().out
    second.unlink()


def test_eval_of_the_configured_base_writes_under_runs_eval_and_never_over_a_file(tmp_path, monkeypatch, capsys):
    profile = str(Path(SMOKE).resolve())
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--config", profile, "--limit", "3", "--max-tokens", "32"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]  # nothing left in the working directory
    result = json.loads((tmp_path / "runs" / "eval" / "builtin-tiny_test.json").read_text())
    assert result["model"] == "builtin:tiny" and result["metrics"]["num_prompts"] == 3
    assert result["max_new_tokens"] == 32 and "accuracy" in capsys.readouterr().out
    out = tmp_path / "mine.json"
    out.write_text("{}")
    assert main(["eval", "--config", profile, "--limit", "2", "--max-tokens", "8", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().endswith("file exists; pass --overwrite to replace it")
    assert out.read_text() == "{}"
    assert main(["eval", "--config", profile, "--limit", "2", "--max-tokens", "8", "--out", str(out),
                 "--overwrite"]) == 0
    assert json.loads(out.read_text())["metrics"]["num_prompts"] == 2


def test_eval_refuses_a_split_the_data_does_not_have(tmp_path, capsys):
    """`eval --split no_such_split` used to exit 0 after scoring a local file's training rows;
    now it is one line naming the flag, the split and the splits there are."""
    rows = [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(3)]
    files = {}
    for split in ("train", "test"):
        files[split] = tmp_path / f"{split}.jsonl"
        files[split].write_text("".join(json.dumps(r) + "\n" for r in rows))
    single = tmp_path / "single.toml"
    single.write_text(f'[data]\ndataset = "{files["train"]}"\n')
    table = tmp_path / "table.toml"
    table.write_text(f'[data]\ndataset = {{train = "{files["train"]}", test = "{files["test"]}"}}\n')
    for profile, expected in [
        (single, r"--split: '.*train.jsonl' is one file, which is the split 'train' alone, not 'no_such_split'"),
        (table, r"--split: data.dataset has no split 'no_such_split' \(its splits: train, test\)"),
    ]:
        assert main(["eval", "--config", str(profile), "--split", "no_such_split"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and re.search(expected, err), err
    assert main(["eval", "--config", str(single)]) == 2  # eval.split = "test": a single file has none
    assert "eval.split: " in capsys.readouterr().err


def test_eval_split_chooses_the_held_out_rows(tiny, tmp_path):
    """[eval] split picks the split that evaluation during training scores: 2 test questions
    or 3 dev questions; a split the data does not have stops before training starts."""
    from mlx_grpo.data.load import DataError

    model, tokenizer = tiny
    files = {}
    for split, n in (("train", 4), ("test", 2), ("dev", 3)):
        files[split] = tmp_path / f"{split}.jsonl"
        files[split].write_text("".join(json.dumps({"question": f"What is {i} + {n}?", "answer": f"#### {i + n}"}) + "\n"
                                        for i in range(n)))
    table = "data.dataset={" + ", ".join(f'{k} = "{v}"' for k, v in files.items()) + "}"

    def scored(split):
        cfg = load_config(SMOKE, [table, "eval.every=1", "eval.max_new_tokens=4", f"eval.split={split}"])
        return make_training_eval(cfg, tokenizer, RewardSet.from_config(cfg.rewards))

    assert scored("test")(model)["eval/num_prompts"] == 2
    assert scored("dev")(model)["eval/num_prompts"] == 3
    with pytest.raises(DataError, match=r"^eval.split: data.dataset has no split 'valid' \(its splits: train, test, dev\)$"):
        scored("valid")


def test_eval_without_config_or_run_is_one_line_error(capsys):
    assert main(["eval", "--model", "builtin:tiny"]) == 2
    assert "give --config FILE" in capsys.readouterr().err


@pytest.mark.parametrize("num_samples", [1, 2])
def test_eval_during_training_logs_eval_metrics_and_changes_nothing_else(tmp_path, num_samples):
    """Evaluating after every step, greedy or with K = 2 samples, leaves every training metric
    and completion as without eval. Step 2 follows an evaluation, so this can fail: before,
    sampled eval reseeded the training stream from a drawn number and step 2 changed."""
    fast = ["training.max_steps=2", "training.prompts_per_step=2", "generation.max_new_tokens=24",
            "checkpoint.save_every=10", "training.learning_rate=1e-3", "logging.log_completions=16"]
    runs = []
    for name, extra in (("plain", []), ("eval", ["eval.every=1", "eval.limit=3", f"eval.num_samples={num_samples}"])):
        cfg = load_config(SMOKE, fast + [f'output_dir="{tmp_path / name}"', *extra])
        train(cfg)
        completions = (Path(cfg.output_dir) / "completions.jsonl").read_text()
        runs.append((read_metrics(cfg.output_dir), completions))
    (plain, plain_texts), (with_eval, eval_texts) = runs
    for row in with_eval:
        assert row["eval/num_prompts"] == 3 and 0.0 <= row["eval/accuracy"] <= 1.0
        assert {"eval/reward", "eval/rewards/gsm8k_correctness/mean", "eval/rewards/xml_format/mean",
                "eval/accuracy_stderr", "eval/reward_stderr"} <= set(row)
        assert (f"eval/pass@{num_samples}" in row) == (num_samples > 1)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING and not k.startswith("eval/")} for r in rows]
    assert strip(plain) == strip(with_eval)
    assert plain_texts == eval_texts and plain_texts.count("\n") == 2 * 2 * 4  # every completion of both steps


def _eval(tiny, *sets, limit=3):
    """evaluate() with the settings the config gives (EvalSettings.from_config), seed 0."""
    model, tokenizer = tiny
    cfg = load_config(SMOKE, ["eval.max_new_tokens=8", *sets])
    examples = load_eval_examples(cfg, tokenizer, cfg.eval.split, limit)
    mx.random.seed(0)
    return evaluate(model, tokenizer, examples, RewardSet.from_config(cfg.rewards),
                    EvalSettings.from_config(cfg), progress=False)


@pytest.mark.parametrize("truncation", ["generation.top_k=1", "generation.top_p=1e-6", "generation.min_p=0.99"])
def test_sampled_eval_uses_the_generation_truncation(tiny, truncation):
    """K = 3 samples at eval.temperature = 5: with top_k = 1, top_p near 0 or min_p = 0.99 only
    the most likely token survives, so every sample is the greedy completion; without, they
    differ. Before, sampled eval ignored top_p, top_k and min_p."""
    sets = ["eval.num_samples=3", "eval.temperature=5.0"]
    truncated = _eval(tiny, *sets, truncation)["samples"]
    assert all(s["samples"] == [s["completion"]] * 3 for s in truncated)
    free = _eval(tiny, *sets)["samples"]
    assert any(s["samples"] != [s["completion"]] * 3 for s in free)


def test_eval_temperature_sets_the_spread_of_the_samples(tiny):
    """eval.temperature: at 1e-4 the K samples are the greedy completion (logits x 10^4), at 5
    they are not."""
    cold = _eval(tiny, "eval.num_samples=3", "eval.temperature=1e-4")["samples"]
    assert all(s["samples"] == [s["completion"]] * 3 for s in cold)
    hot = _eval(tiny, "eval.num_samples=3", "eval.temperature=5.0")["samples"]
    assert any(s["samples"] != [s["completion"]] * 3 for s in hot)


def test_eval_batch_size_and_max_new_tokens_shape_the_decoding(tiny, monkeypatch):
    """eval.batch_size: 5 prompts at 2 a time decode as 2 + 2 + 1 (greedy, then the K = 2
    samples); eval.max_new_tokens caps every completion (0 = generation.max_new_tokens)."""
    import mlx_grpo.commands.evaluate as evaluate_module

    calls, real = [], evaluate_module.generate_completions

    def recording(model, tokenizer, prompts, **kw):
        calls.append((len(prompts), kw["num_generations"], kw["max_new_tokens"]))
        return real(model, tokenizer, prompts, **kw)

    monkeypatch.setattr(evaluate_module, "generate_completions", recording)
    result = _eval(tiny, "eval.batch_size=2", "eval.num_samples=2", "eval.max_new_tokens=3", limit=5)
    assert calls == [(2, 1, 3), (2, 1, 3), (1, 1, 3), (2, 2, 3), (2, 2, 3), (1, 2, 3)]
    assert result["metrics"]["completions/mean_length"] <= 3
    assert all(len(tiny[1].encode(c, add_special_tokens=False)) <= 3
               for s in result["samples"] for c in [s["completion"], *s["samples"]])
    calls.clear()
    _eval(tiny, "eval.batch_size=5", "eval.max_new_tokens=0", "generation.max_new_tokens=4", limit=5)
    assert calls == [(5, 1, 4)]


def test_eval_config_keys_are_checked():
    from mlx_grpo.config import ConfigError

    with pytest.raises(ConfigError, match=r"eval.num_samples must be in \[1, 1024\], got 0"):
        load_config(SMOKE, ["eval.num_samples=0"])
    with pytest.raises(ConfigError, match=r"unknown key 'eval.evrey' \(did you mean 'eval.every'\?\)"):
        load_config(SMOKE, ["eval.evrey=5"])


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_out_that_is_a_folder_is_one_line_asking_for_a_file(tmp_path, overwrite):
    """`eval --out DIR` said 'file exists; pass --overwrite', and with --overwrite '[Errno 21] Is a
    directory' (naming no flag): the advice it gave could not work."""
    from mlx_grpo.commands.evaluate import output_path
    from mlx_grpo.errors import UserError

    folder = tmp_path / "results"
    folder.mkdir()
    with pytest.raises(UserError, match=rf"^--out {re.escape(str(folder))}: is a folder; give a file, e.g. "
                                        rf"--out {re.escape(str(folder / 'eval.json'))}$"):
        output_path(str(folder), None, "test", "m", overwrite)
