"""Conversational data, as TRL takes it: a prompt field holding {role, content} messages is
rendered with the model's chat template, and a system message in the data replaces
data.system_prompt."""

import json

import pytest

import mlx_grpo
from mlx_grpo.config import DataConfig
from mlx_grpo.data.load import DataError
from mlx_grpo.data.examples import load_examples
from mlx_grpo.run.log import read_jsonl

SYSTEM = {"role": "system", "content": "Answer with a number."}
USER = {"role": "user", "content": "What is 2 + 3?"}
ROWS = [
    {"prompt": [SYSTEM, USER], "answer": "#### 5"},
    {"prompt": [USER], "answer": "#### 5"},
    {"prompt": [USER, {"role": "assistant", "content": "5"}, {"role": "user", "content": "And 5 + 1?"}],
     "answer": "#### 6"},
]


def _jsonl(tmp_path, rows):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_messages_are_rendered_with_the_chat_template(tmp_path, tiny):
    _, tok = tiny
    cfg = DataConfig(dataset=_jsonl(tmp_path, ROWS), prompt_field="prompt", system_prompt="Be brief.")
    examples = load_examples(cfg, tok)
    template = lambda messages: tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert examples[0].prompt == template([SYSTEM, USER])  # the data's system message, not Be brief.
    assert examples[1].prompt == template([{"role": "system", "content": "Be brief."}, USER])
    assert examples[2].prompt == template([{"role": "system", "content": "Be brief."}, *ROWS[2]["prompt"]])
    assert examples[2].prompt.endswith("And 5 + 1?<|im_end|>\n<|im_start|>assistant\n")
    assert [e.question for e in examples] == ["What is 2 + 3?", "What is 2 + 3?", "And 5 + 1?"]
    assert tok.decode(examples[0].prompt_tokens) == examples[0].prompt


@pytest.mark.parametrize(("prompt", "message"), [
    ([{"role": "robot", "content": "hi"}], "row 0 field 'prompt': each message must be {role: system / user"),
    ([SYSTEM], "row 0 field 'prompt': the conversation has no user message"),
])
def test_a_bad_conversation_names_the_row(tiny, prompt, message):
    from mlx_grpo.data.examples import build_examples

    with pytest.raises(DataError, match=message.replace("{", r"\{").replace("(", r"\(")):
        build_examples([{"prompt": prompt, "answer": "1"}], tiny[1], DataConfig(prompt_field="prompt"))


def test_a_conversational_data_set_trains(tmp_path):
    run = mlx_grpo.train("configs/smoke_test.toml", dataset=ROWS * 2, data={"prompt_field": "prompt"},
                         output_dir=str(tmp_path / "run"),
                         training={"max_steps": 1, "prompts_per_step": 2}, generation={"max_new_tokens": 8})
    assert {r["prompt"] for r in read_jsonl(run / "completions.jsonl")} <= {"What is 2 + 3?", "And 5 + 1?"}
