import csv
import json

import pytest

from mlx_grpo.config import DataConfig
from mlx_grpo.data.load import DataError, load_rows
from mlx_grpo.data.examples import PromptStream, load_examples

ROWS = [{"q": "What is 2 + 3?", "a": "2 + 3 = 5\n#### 5"}, {"q": "What is 9 - 4?", "a": "#### 5"}]


def _write(tmp_path, fmt, rows=ROWS):
    path = tmp_path / f"data.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt == "csv":
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    elif fmt == "parquet":
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet"])
def test_local_files_with_field_mapping(tmp_path, fmt, tiny):
    _, tokenizer = tiny
    cfg = DataConfig(dataset=_write(tmp_path, fmt), prompt_field="q", answer_field="a", system_prompt="Be brief.")
    examples = load_examples(cfg, tokenizer)
    assert [e.question for e in examples] == [r["q"] for r in ROWS]
    assert [e.answer for e in examples] == [r["a"] for r in ROWS]
    first = examples[0]
    assert first.prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert first.prompt.endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(first.prompt_tokens) == first.prompt


def test_missing_field_names_row_and_fields(tmp_path, tiny):
    cfg = DataConfig(dataset=_write(tmp_path, "jsonl"), prompt_field="question", answer_field="a")
    with pytest.raises(DataError, match=r"row 0 has no field 'question' \(fields: q, a\).*data.prompt_field"):
        load_examples(cfg, tiny[1])


def test_empty_field_is_an_error(tmp_path, tiny):
    path = _write(tmp_path, "jsonl", [{"q": "ok", "a": "1"}, {"q": "  ", "a": "2"}])
    with pytest.raises(DataError, match="row 1 field 'q' must be non-empty text"):
        load_examples(DataConfig(dataset=path, prompt_field="q", answer_field="a"), tiny[1])


def test_long_prompts_are_skipped_and_counted(tmp_path, tiny, capsys):
    rows = ROWS + [{"q": "What is 1 + 1? " * 40, "a": "#### 2"}]
    cfg = DataConfig(dataset=_write(tmp_path, "jsonl", rows), prompt_field="q", answer_field="a",
                     max_prompt_tokens=100)
    assert len(load_examples(cfg, tiny[1])) == 2
    assert "skipped 1 of 3 prompts" in capsys.readouterr().out


def test_missing_file_and_bad_extension(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_rows(str(tmp_path / "nope.jsonl"))
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(DataError, match="unknown extension"):
        load_rows(str(tmp_path / "data.txt"))


def test_builtin_arithmetic_is_deterministic_and_has_splits():
    a, b = load_rows("builtin:arithmetic", seed=3), load_rows("builtin:arithmetic", seed=3)
    assert a == b and a[0]["answer"].rsplit("#### ", 1)[1].lstrip("-").isdigit()
    test = load_rows("builtin:arithmetic", split="test", seed=3)
    assert not {r["question"] for r in test} & {r["question"] for r in a}
    with pytest.raises(DataError, match="splits train, test"):
        load_rows("builtin:arithmetic", split="validation")


def test_prompt_stream_reshuffles_each_epoch_and_resumes():
    items = list(range(5))
    stream = PromptStream(items, shuffle=True, seed=1)
    first, second = stream.take(5), stream.take(5)
    assert sorted(first) == sorted(second) == items and first != second
    resumed = PromptStream(items, shuffle=True, seed=1, position=5)
    assert resumed.take(5) == second
    assert PromptStream(items, shuffle=False, seed=1).take(7) == [0, 1, 2, 3, 4, 0, 1]


def test_a_local_file_is_the_train_split_alone(tmp_path):
    """A single local file used to be loaded whole whatever split was asked, so evaluating on
    "test" scored the training rows. Now it is the split "train" and no other."""
    path = _write(tmp_path, "jsonl")
    assert load_rows(path, split="train") == ROWS
    with pytest.raises(DataError, match=r"^eval.split: '.*data.jsonl' is one file, which is the split 'train' alone, "
                                        r"not 'test'; give data.dataset a file per split"):
        load_rows(path, split="test", setting="eval.split")


def test_a_table_of_files_gives_each_split_its_own_rows(tmp_path):
    train, test = tmp_path / "train", tmp_path / "test"
    train.mkdir(), test.mkdir()
    splits = {"train": _write(train, "jsonl"), "test": _write(test, "csv", ROWS[::-1])}
    assert load_rows(splits, split="train") == ROWS
    assert load_rows(splits, split="test") == ROWS[::-1]
    with pytest.raises(DataError, match=r"^--split: data.dataset has no split 'dev' \(its splits: train, test\)$"):
        load_rows(splits, split="dev", setting="--split")
    with pytest.raises(DataError, match=r"^data.dataset.test: file '.*nope.jsonl' does not exist$"):
        load_rows({"train": splits["train"], "test": str(tmp_path / "nope.jsonl")}, split="test")


def test_subset_names_a_hub_config_and_is_refused_elsewhere(tmp_path, monkeypatch):
    """data.subset goes to `datasets` as the config name of a hub data set; a local file, a
    table of files or a built-in data set has no configs, and setting one is an error, not
    silence (before, it was ignored)."""
    import datasets

    from mlx_grpo.data import load

    calls = []
    monkeypatch.setattr(load, "_reach_hub", lambda name: None)  # no hub here
    monkeypatch.setattr(datasets, "load_dataset",
                        lambda path, name=None, split=None, data_files=None: calls.append((path, name, split)) or ROWS)
    assert load_rows("org/maths", subset="main", split="test") == ROWS
    assert calls == [("org/maths", "main", "test")]
    for dataset in (_write(tmp_path, "jsonl"), {"train": _write(tmp_path, "jsonl")}, "builtin:arithmetic"):
        with pytest.raises(DataError, match=r"^data.subset: .* has no subsets \(configs\), got 'main'"):
            load_rows(dataset, subset="main")


def test_dataset_table_in_the_config(tmp_path):
    from mlx_grpo.config import ConfigError, load_config

    cfg = load_config(None, ['data.dataset={train = "a.jsonl", test = "b.jsonl"}'])
    assert cfg.data.dataset == {"train": "a.jsonl", "test": "b.jsonl"}
    with pytest.raises(ConfigError, match=r"data.dataset.test must be a string, got integer 3"):
        load_config(None, ["data.dataset={train = 'a.jsonl', test = 3}"])
    with pytest.raises(ConfigError, match=r"data.dataset must be a non-empty string .* or a non-empty table"):
        load_config(None, ["data.dataset={}"])


def test_loading_local_files_prints_no_progress_bars_and_leaves_them_on(tmp_path, capfd):
    import datasets

    # Content unique to this test: a cached copy would skip the 'Generating' bar anyway.
    path = tmp_path / "quiet.jsonl"
    path.write_text(json.dumps({"question": f"What is 1 + 1? {tmp_path.name}", "answer": "#### 2"}) + "\n")
    table = {"train": str(path), "test": str(path)}
    capfd.readouterr()
    assert len(load_rows(str(path))) == 1 and len(load_rows(table, split="test")) == 1
    printed = capfd.readouterr()
    assert "Generating" not in printed.err + printed.out and printed.err + printed.out == ""
    assert datasets.is_progress_bar_enabled()  # put back for a hub download later
