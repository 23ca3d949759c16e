"""The Python API, `mlx_grpo.train`: the same run as the command line, reward functions and rows
given as Python objects, overrides checked as `--set` items are, and the docs' example."""

import re
import sys
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


def test_the_docs_example_runs(tmp_path):
    readme = (Path(__file__).parent.parent / "docs" / "data-and-rewards.md").read_text()
    code = re.search(r"## Python API\n.*?```python\n(.*?)```", readme, re.S).group(1)
    assert len(code.strip().splitlines()) <= 10
    assert '"runs/python_api"' in code and '"max_steps": 2,' in code
    code = code.replace('"runs/python_api"', repr(str(tmp_path / "run"))).replace('"max_steps": 2,', '"max_steps": 1,')
    exec(compile(code, "docs/data-and-rewards.md", "exec"), {})
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1]


def _says_two(prompts, completions, answers, **kwargs):
    return [float("2" in c) for c in completions]


@pytest.mark.parametrize(("kwargs", "needles"), [
    ({"rewards": [42]}, ["rewards[0] is int 42", "a reward function, a reward name or a (reward, weight) pair"]),
    ({"rewards": "xml_format"}, ["rewards=...): expected a list of reward functions", "got str 'xml_format'",
                                 "rewards=['xml_format']"]),
    ({"rewards": _says_two}, ["rewards=...): expected a list", "got function"]),
    ({"rewards": [(_says_two, "high")]}, ["rewards[0] is tuple", "with a number as weight"]),
    ({"dataset": [1, 2, 3]}, ["dataset=...): row 0 is int 1, not a dict", "a dict of columns"]),
    ({"dataset": []}, ["dataset=...): no rows"]),
    ({"dataset": 7}, ["dataset=...): expected a list of dicts (rows)", "got int 7"]),
    ({"dataset": {"question": "What is 1 + 1?", "answer": "#### 2"}},
     ["a dict is read as columns", "dataset=[row]"]),
    ({"dataset": {"question": ["a", "b"], "answer": ["#### 1"]}}, ["the columns differ in length"]),
    ({"config": ["configs/smoke_test.toml"]}, ["config=...): expected a TOML profile's path", "got list"]),
    ({"config": 2}, ["config=...): expected a TOML profile's path", "got int 2"]),
], ids=["reward 42", "reward name alone", "function alone", "weight text", "rows of ints", "no rows", "int",
        "one row as dict", "ragged columns", "config list", "config 2"])
def test_an_argument_of_the_wrong_kind_is_one_clear_error_naming_it(tmp_path, capfd, kwargs, needles):
    """Before: AttributeError, 'listed more than once: m', ValueError, TypeError; config=2 closed stderr."""
    from mlx_grpo.api import ApiError
    from mlx_grpo.errors import UserError

    kwargs = {"config": SMOKE, **kwargs}
    with pytest.raises(ApiError) as e:
        mlx_grpo.train(output_dir=str(tmp_path / "run"), **kwargs)
    assert isinstance(e.value, UserError)
    for needle in needles:
        assert needle in str(e.value), str(e.value)
    assert not (tmp_path / "run").exists()
    print("stderr still open", file=sys.stderr, flush=True)
    assert "stderr still open" in capfd.readouterr().err


def test_load_config_never_opens_a_number_as_a_file(capfd):
    with pytest.raises(ConfigError, match="profile: expected a TOML file's path, a dict or a Config, got int 2"):
        load_config(2)
    print("stderr still open", file=sys.stderr, flush=True)
    assert "stderr still open" in capfd.readouterr().err


ROWS = [{"question": f"What is {a} + 1?", "answer": f"#### {a + 1}"} for a in range(4)]


@pytest.mark.parametrize("form", ["columns", "jsonl file", "path object"])
def test_a_dict_of_columns_or_a_data_file_is_the_rows(tmp_path, form):
    """The same run as the list of rows gives."""
    import json

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    dataset = {"columns": {k: [r[k] for r in ROWS] for k in ROWS[0]}, "jsonl file": str(data),
               "path object": data}[form]
    run = mlx_grpo.train(SMOKE, dataset=dataset, output_dir=str(tmp_path / "run"), **SMALL)
    as_rows = mlx_grpo.train(SMOKE, dataset=ROWS, output_dir=str(tmp_path / "rows"), **SMALL)
    assert _untimed(run) == _untimed(as_rows)
    if form != "columns":
        assert load_config(run / "config.toml").data.dataset == str(data)
