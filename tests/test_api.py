"""The Python API, `mlx_grpo.train`: the same run as the command line, reward functions and rows
given as Python objects, overrides checked as `--set` items are, and the README's example."""

import re
from pathlib import Path

import pytest

import mlx_grpo
from mlx_grpo.cli import main as cli_main
from mlx_grpo.config import ConfigError, load_config
from mlx_grpo.run.log import read_jsonl, read_metrics

SMOKE = "configs/smoke_test.toml"
TIMING = {"step_time", "tokens_per_second", "peak_memory_gb", "time/rewards"}
SMALL = {"training": {"max_steps": 2, "prompts_per_step": 2}, "generation": {"max_new_tokens": 16},
         "checkpoint": {"save_every": 10}}


def _untimed(run):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(run)]


def test_train_is_the_function_and_makes_the_cli_run(tmp_path):
    assert callable(mlx_grpo.train) and mlx_grpo.train.__module__ == "mlx_grpo.api"
    run = mlx_grpo.train(SMOKE, output_dir=str(tmp_path / "api"), seed=3, **SMALL)
    assert run == tmp_path / "api"
    code = cli_main(["train", "--config", SMOKE, "--set", f'output_dir="{tmp_path / "cli"}"', "--set", "seed=3",
                     "--set", "training.max_steps=2", "--set", "training.prompts_per_step=2",
                     "--set", "generation.max_new_tokens=16", "--set", "checkpoint.save_every=10"])
    assert code == 0
    assert _untimed(run) == _untimed(tmp_path / "cli") and len(_untimed(run)) == 2
    assert read_jsonl(run / "completions.jsonl") == read_jsonl(tmp_path / "cli" / "completions.jsonl")


def test_a_dict_or_a_config_object_is_the_profile(tmp_path):
    """A dict of the profile's shape and a Config give the run the file gives."""
    as_dict = {"generation": {"num_generations": 4, "max_new_tokens": 16}, "training": {"learning_rate": 2e-4}}
    run_a = mlx_grpo.train(as_dict, output_dir=str(tmp_path / "a"), **SMALL)
    cfg = load_config(as_dict)
    run_b = mlx_grpo.train(cfg, output_dir=str(tmp_path / "b"), **SMALL)
    assert _untimed(run_a) == _untimed(run_b)
    assert load_config(run_a / "config.toml").generation.num_generations == 4


def brevity(prompts, completions, answers, **kwargs):
    return [1.0 if len(c) < 20 else 0.0 for c in completions]


def test_reward_functions_and_rows_are_used_and_logged_by_name(tmp_path):
    def says_four(prompts, completions, answers, **kwargs):
        return [float("4" in c) for c in completions]

    rows = [{"question": f"What is {a} + {b}?", "answer": f"#### {a + b}"} for a in range(3) for b in range(3)]
    run = mlx_grpo.train(SMOKE, rewards=[brevity, (says_four, 0.5)], dataset=rows,
                         output_dir=str(tmp_path / "run"), **SMALL)
    rows_logged = read_metrics(run)
    assert {"rewards/brevity/mean", "rewards/says_four/mean"} <= set(rows_logged[0])
    assert "rewards/gsm8k_correctness/mean" not in rows_logged[0]
    prompts = {r["prompt"] for r in read_jsonl(run / "completions.jsonl")}
    assert prompts <= {r["question"] for r in rows}
    saved = load_config(run / "config.toml")
    assert [(r.name, r.weight) for r in saved.rewards] == [("test_api:brevity", 1.0), ("says_four", 0.5)]


def test_a_datasets_dataset_is_rows(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list([{"question": f"What is {a} + 1?", "answer": f"#### {a + 1}"} for a in range(4)])
    run = mlx_grpo.train(SMOKE, dataset=ds, output_dir=str(tmp_path / "run"), **SMALL)
    assert {r["prompt"] for r in read_jsonl(run / "completions.jsonl")} <= set(ds["question"])


@pytest.mark.parametrize(("overrides", "message"), [
    ({"training": {"max_stepz": 3}},
     "mlx_grpo.train(training=...): unknown key 'training.max_stepz' (did you mean 'training.max_steps'?)"),
    ({"sed": 1}, "mlx_grpo.train(sed=...): unknown key 'sed' (did you mean 'seed'?)"),
    ({"training": {"max_steps": "3"}},
     "mlx_grpo.train(training=...): training.max_steps must be an integer, got string '3'"),
])
def test_keyword_overrides_are_checked_as_set_items_are(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as e:
        mlx_grpo.train(SMOKE, output_dir=str(tmp_path / "run"), **overrides)
    assert str(e.value) == message
    assert not (tmp_path / "run").exists()


def test_the_readme_example_runs(tmp_path):
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    code = re.search(r"## Python API\n.*?```python\n(.*?)```", readme, re.S).group(1)
    assert len(code.strip().splitlines()) <= 10
    assert '"runs/python_api"' in code and '"max_steps": 20' in code
    code = code.replace('"runs/python_api"', repr(str(tmp_path / "run"))).replace('"max_steps": 20', '"max_steps": 1')
    exec(compile(code, "README.md", "exec"), {})
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1]
