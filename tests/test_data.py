import csv
import json

import pytest

from mlx_grpo.config import DataConfig
from mlx_grpo.data import DataError, PromptStream, load_examples, load_rows

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
