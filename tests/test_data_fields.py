"""Every field of a row is kept for the rewards: an answer of any JSON type as it is, the other
fields beside it, a per-row system prompt (data.system_field); a field named in the config
that a row lacks names the fields there are."""

import json

import pytest

from mlx_grpo.config import DataConfig
from mlx_grpo.data.load import DataError
from mlx_grpo.data.examples import load_examples

ROWS = [
    {"q": "What is 2 + 3?", "a": 5, "tests": [{"in": 1, "out": 2}], "sys": "Answer in one word."},
    {"q": "What is 9 - 4?", "a": {"value": 5}, "tests": [], "sys": ""},
]


def _jsonl(tmp_path, rows):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_an_answer_of_any_json_type_and_every_field_reach_the_example(tmp_path, tiny):
    rows = ROWS + [{"q": "What is 1 + 1?", "a": [2, "two"], "tests": [{"in": 0, "out": 0}], "sys": "x"}]
    examples = load_examples(DataConfig(dataset=_jsonl(tmp_path, rows), prompt_field="q", answer_field="a"), tiny[1])
    assert [e.answer for e in examples] == [5, {"value": 5}, [2, "two"]]
    assert examples[0].columns == {"a": 5, "tests": [{"in": 1, "out": 2}], "sys": "Answer in one word."}
    assert [e.row for e in examples] == [0, 1, 2] and all(e.messages is None for e in examples)


@pytest.mark.parametrize("answer", [None, "  "])
def test_an_empty_answer_is_still_an_error(tmp_path, tiny, answer):
    path = _jsonl(tmp_path, [{"q": "ok", "a": 1}, {"q": "fine", "a": answer}])
    with pytest.raises(DataError, match=r"row 1 field 'a' must hold a value \(text, number, list or table\)"):
        load_examples(DataConfig(dataset=path, prompt_field="q", answer_field="a"), tiny[1])


def test_a_system_prompt_field_is_each_rows_own(tmp_path, tiny):
    cfg = DataConfig(dataset=_jsonl(tmp_path, ROWS), prompt_field="q", answer_field="a", system_field="sys",
                     system_prompt="Never used.")
    first, second = load_examples(cfg, tiny[1])
    assert first.prompt == "<|im_start|>system\nAnswer in one word.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?" \
                           "<|im_end|>\n<|im_start|>assistant\n"
    assert second.prompt == "<|im_start|>user\nWhat is 9 - 4?<|im_end|>\n<|im_start|>assistant\n"  # "" = none


def test_a_conversational_row_keeps_its_messages_with_the_rows_system_prompt(tmp_path, tiny):
    rows = [{"messages": [{"role": "user", "content": "What is 2 + 3?"}], "a": 5, "sys": "Be brief."}]
    cfg = DataConfig(dataset=_jsonl(tmp_path, rows), prompt_field="messages", answer_field="a", system_field="sys")
    (e,) = load_examples(cfg, tiny[1])
    assert e.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    assert e.question == "What is 2 + 3?" and e.columns == {"a": 5, "sys": "Be brief."}


@pytest.mark.parametrize(("key", "value", "message"), [
    ("answer_field", "ans", r"row 0 has no field 'ans' \(fields: q, a, tests, sys\); set data.answer_field"),
    ("system_field", "system", r"row 0 has no field 'system' \(fields: q, a, tests, sys\); set data.system_field"),
    ("prompt_field", "prompt", r"row 0 has no field 'prompt' \(fields: q, a, tests, sys\); set data.prompt_field"),
])
def test_a_field_named_in_the_config_but_missing_names_the_fields(tmp_path, tiny, key, value, message):
    cfg = DataConfig(dataset=_jsonl(tmp_path, ROWS), **{"prompt_field": "q", "answer_field": "a", key: value})
    with pytest.raises(DataError, match=message):
        load_examples(cfg, tiny[1])


def test_a_system_field_that_is_not_text_is_an_error(tmp_path, tiny):
    path = _jsonl(tmp_path, [{"q": "ok", "a": 1, "sys": 3}])
    with pytest.raises(DataError, match=r"row 0 field 'sys' \(data.system_field\) must be text, got 3"):
        load_examples(DataConfig(dataset=path, prompt_field="q", answer_field="a", system_field="sys"), tiny[1])
