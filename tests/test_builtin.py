"""The built-in arithmetic data set and the built-in models, all offline.

The tiny model comes from conftest's `tiny_path` / `tiny` fixtures: the files shipped in the
package. builtin:small is built into a temporary cache, and must be the same bytes everywhere.
"""

import hashlib
import json
import random
import re
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm import generate, load
from mlx_lm.generate import batch_generate
from mlx_lm.sample_utils import make_sampler

from mlx_grpo.data import arithmetic
from mlx_grpo.models import builtin as builtin_models
from mlx_grpo.models.builtin import builtin_model_path
from mlx_grpo.errors import ModelError
from mlx_grpo.data.chat import DEFAULT_SYSTEM_PROMPT


def weights_digest(folder: Path) -> str:
    """SHA-256 over the names and raw float32 bytes of a model folder's tensors, sorted (a test
    helper: the package itself never needed it)."""
    h = hashlib.sha256()
    for f in sorted(folder.glob("model*.safetensors")):
        for name, array in sorted(mx.load(str(f)).items()):
            h.update(name.encode())
            h.update(np.array(array.astype(mx.float32)).tobytes())
    return h.hexdigest()


QUESTION = re.compile(r"What is (\d) ([+-]) (\d)(?: ([+-]) (\d))?\?")
ANSWER = re.compile(r"<answer>\n(.*?)\n</answer>")
REASONED = re.compile(r"<reasoning>\n(.*?)\n</reasoning>\n<answer>\n(.*?)\n</answer>", re.S)


def test_make_problems_is_deterministic():
    assert arithmetic.make_problems(50, seed=3) == arithmetic.make_problems(50, seed=3)
    assert arithmetic.make_problems(50, seed=3) != arithmetic.make_problems(50, seed=4)
    assert arithmetic.make_problems(50, seed=3, split="test") != arithmetic.make_problems(50, seed=3)


def _apply(x, op, y):
    return x + y if op == "+" else x - y


@pytest.mark.parametrize("split", arithmetic.SPLITS)
def test_answers_are_worked_steps_in_gsm8k_format(split):
    rows = arithmetic.make_problems(400, seed=0, split=split)
    for row in rows:
        a, op, b, op2, c = QUESTION.fullmatch(row["question"]).groups()
        x = _apply(int(a), op, int(b))
        steps = [f"{a} {op} {b} = {x}"]
        if op2:
            steps.append(f"{x} {op2} {c} = {_apply(x, op2, int(c))}")
        result = steps[-1].rsplit(" ", 1)[1]
        assert row["answer"] == "\n".join(steps) + f"\n#### {result}"
        assert arithmetic.final_answer(row) == result
        assert all(0 <= int(s.rsplit(" ", 1)[1]) <= 9 for s in steps)  # single digits throughout
    two_step = sum(QUESTION.fullmatch(r["question"]).group(4) is not None for r in rows) / len(rows)
    assert 0.85 < two_step < 0.95  # 1210 of the 1320 questions have two steps


def test_train_and_test_questions_are_disjoint():
    # 2000 rows cycle through each whole pool at least twice.
    train = {r["question"] for r in arithmetic.make_problems(2000, seed=0, split="train")}
    test = {r["question"] for r in arithmetic.make_problems(2000, seed=1, split="test")}
    assert (len(train), len(test)) == (995, 325)
    assert not train & test


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="valid"):
        arithmetic.make_problems(3, seed=0, split="valid")
    with pytest.raises(ModelError, match="unknown built-in model 'huge'.*tiny, tiny-tools, small"):
        builtin_model_path("huge")


def test_format_completion_step_by_step_or_one_line():
    row = {"question": "What is 2 + 7 - 3?", "answer": "2 + 7 = 9\n9 - 3 = 6\n#### 6"}
    assert arithmetic.format_completion(row) == (
        "<reasoning>\n2 + 7 = 9\n9 - 3 = 6\n</reasoning>\n<answer>\n6\n</answer>"
    )
    assert arithmetic.format_completion(row, step_by_step=False) == (
        "<reasoning>\n2 + 7 - 3 = 6\n</reasoning>\n<answer>\n6\n</answer>"
    )


def test_shipped_tiny_matches_its_manifest_and_a_damaged_copy_is_refused(tmp_path):
    shipped = builtin_model_path("tiny")
    assert shipped == builtin_models.SHIPPED / "tiny"
    entries = json.loads((shipped / "manifest.json").read_text())["files"]
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(entries)
    copy = tmp_path / "tiny"
    shutil.copytree(shipped, copy)
    with open(copy / "model.safetensors", "r+b") as f:  # one flipped byte in the weights
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(ModelError, match=r"model.safetensors: SHA-256 differs from manifest.json"):
        builtin_models.verified(copy)
    other = shutil.copytree(shipped, tmp_path / "other")
    (other / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match=r"tokenizer.json: missing"):
        builtin_models.verified(other)


def test_tiny_is_used_in_place_with_no_build_and_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_GRPO_CACHE", str(tmp_path / "cache"))
    assert builtin_model_path("tiny") == builtin_models.SHIPPED / "tiny"
    assert not (tmp_path / "cache").exists()


def test_the_wheel_ships_the_tiny_model():
    # hatchling puts every file under the package folder into the wheel, unless git ignores it.
    import subprocess

    tracked = subprocess.run(["git", "ls-files", "mlx_grpo/builtin/tiny"], capture_output=True, text=True,
                             check=True).stdout.split()
    names = {Path(p).name for p in tracked}
    manifest = json.loads((builtin_models.SHIPPED / "tiny" / "manifest.json").read_text())["files"]
    assert set(manifest) | {"manifest.json"} <= names


# What any machine must get for builtin:small: the digest of its tensors' float32 bytes.
SMALL_DIGEST = "44651f9e8ed385b05c015076fc3a22346b12ce20ed3a69578bed93e0590e90e9"


def test_small_is_the_same_bytes_on_every_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_GRPO_CACHE", str(tmp_path))
    path = builtin_model_path("small")
    assert path.parent == tmp_path and path.name.startswith("small-")
    assert weights_digest(path) == SMALL_DIGEST
    assert builtin_model_path("small") == path  # the second call reuses the folder
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary folder left behind
    model, tokenizer = load(str(path))
    assert 20e6 < sum(p.size for _, p in tree_flatten(model.parameters())) < 30e6
    assert tokenizer.eos_token == "<|im_end|>"


def test_building_small_leaves_the_callers_random_streams_alone(tmp_path, monkeypatch):
    # Building draws (MLX initialises layers before their weights are replaced); a run that
    # builds the model on first use must sample what every later run samples.
    monkeypatch.setenv("MLX_GRPO_CACHE", str(tmp_path))

    def draws(build: bool):
        mx.random.seed(7)
        np.random.seed(7)
        random.seed(7)
        if build:
            builtin_model_path("small")
        return mx.random.uniform(shape=(3,)).tolist(), np.random.rand(), random.random()

    assert draws(build=True) == draws(build=False)


def test_losing_a_concurrent_build_uses_the_winners_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_GRPO_CACHE", str(tmp_path))
    final = {}

    def build_while_another_process_wins(path, config):
        (path / "ours").write_text("")
        final["path"] = path.parent / path.name.split(".")[1]
        final["path"].mkdir()
        (final["path"] / "theirs").write_text("")

    monkeypatch.setattr(builtin_models, "_build_small", build_while_another_process_wins)
    assert builtin_model_path("small") == final["path"]
    assert [p.name for p in final["path"].iterdir()] == ["theirs"]
    assert [p.name for p in tmp_path.iterdir()] == [final["path"].name]


def _prompt(tokenizer, question, tokenize=True):
    messages = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=tokenize)


def test_tiny_checkpoint(tiny_path):
    model, _ = load(tiny_path)  # mlx_lm.load, offline
    config = json.loads((Path(tiny_path) / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["tie_word_embeddings"] is True
    params = dict(tree_flatten(model.parameters()))
    assert all(p.dtype == mx.float32 for p in params.values())
    assert 0.7e6 < sum(p.size for p in params.values()) < 1.3e6


def test_tiny_tokenizer(tiny):
    _, tokenizer = tiny
    assert _prompt(tokenizer, "What is 7 + 5?", tokenize=False) == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n"
        "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_ids == {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    assert tokenizer.pad_token == "<|endoftext|>"
    completion = arithmetic.format_completion({"answer": "2 + 7 = 9\n9 - 3 = 6\n#### 6"})
    for text in ["What is 12 + 345?", "Hello, wörld!\n\n  tabs\tand 🙂", completion]:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    digits = tokenizer.encode("2024", add_special_tokens=False)
    assert [tokenizer.decode([t]) for t in digits] == list("2024")
    assert len(tokenizer.encode(completion + "<|im_end|>")) < 48


def test_tiny_generates_text(tiny):
    model, tokenizer = tiny
    text = generate(model, tokenizer, _prompt(tokenizer, "What is 3 + 4?"), max_tokens=64)
    assert text.startswith("<reasoning>\n3 + 4 = ")


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_tiny_is_partly_right_on_held_out_questions(tiny, temperature):
    model, tokenizer = tiny
    rows = arithmetic.make_problems(32, seed=0, split="test")
    mx.random.seed(0)
    out = batch_generate(
        model,
        tokenizer,
        [_prompt(tokenizer, r["question"]) for r in rows],
        max_tokens=64,
        sampler=make_sampler(temperature),
        return_token_ids=True,
    )
    answers = [m.group(1) if (m := ANSWER.search(t)) else None for t in out.texts]
    formatted = sum(a is not None for a in answers) / len(rows)
    stopped = sum(len(ids) < 64 for ids in out.token_ids) / len(rows)  # batch_generate drops the EOS
    correct = sum(a == arithmetic.final_answer(r) for a, r in zip(answers, rows)) / len(rows)
    print(f"temperature {temperature}: format {formatted:.2f}, stopped {stopped:.2f}, correct {correct:.2f}")
    assert formatted >= 0.9 and stopped >= 0.9, (formatted, stopped)
    assert 0.05 < correct < 0.9, correct


def test_tiny_mixes_styles_and_steps_are_more_often_right(tiny):
    # What GRPO has to work with: at temperature 1 the shipped model writes a held-out
    # two-step question either as worked steps or as one line (0.48 of them as steps), and the
    # steps are right more often (0.47 against 0.31; seed 0 on this CPU backend).
    model, tokenizer = tiny
    rows = [r for r in arithmetic.make_problems(325, seed=0, split="test") if r["answer"].count("\n") == 2][:128]
    mx.random.seed(0)
    out = batch_generate(model, tokenizer, [_prompt(tokenizer, r["question"]) for r in rows], max_tokens=64,
                         sampler=make_sampler(1.0))
    by_style = {True: [], False: []}  # step by step -> [right or not]
    for text, row in zip(out.texts, rows):
        if m := REASONED.search(text):
            by_style[m.group(1).count("\n") == 1].append(m.group(2) == arithmetic.final_answer(row))
    share = len(by_style[True]) / len(rows)
    right = {style: sum(v) / len(v) for style, v in by_style.items()}
    print(f"stepwise share {share:.2f}, right: stepwise {right[True]:.2f}, one line {right[False]:.2f}")
    assert 0.25 < share < 0.75, share
    assert right[True] > right[False] + 0.05, right


def test_the_recipe_rebuilds_the_shipped_tokenizer_and_a_loadable_model(tmp_path):
    # The warm start's weights depend on the machine's float rounding; the tokenizer does not.
    from mlx_grpo.models import tiny_recipe

    short = {**tiny_recipe.WARM_START, "steps": 3, "warmup": 1}
    tiny_recipe.build(tmp_path, short)
    shipped = builtin_models.SHIPPED / "tiny"
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (tmp_path / name).read_text() == (shipped / name).read_text(), name
    model, tokenizer = load(str(tmp_path))
    assert tokenizer.eos_token == "<|im_end|>"
    assert sum(p.size for _, p in tree_flatten(model.parameters())) == sum(
        p.size for _, p in tree_flatten(load(str(shipped))[0].parameters()))


def test_worked_steps_are_likelier_for_larger_first_operands():
    from mlx_grpo.models.tiny_recipe import stepwise_probability

    assert stepwise_probability("What is 0 + 3 - 1?", 0.1, 0.9) == pytest.approx(0.1)
    assert stepwise_probability("What is 9 - 3 + 1?", 0.1, 0.9) == pytest.approx(0.9)
    assert stepwise_probability("What is 3 + 3?", 0.1, 0.9) == pytest.approx(0.1 + 0.8 * 3 / 9)


def test_held_out_questions_do_not_depend_on_the_seed():
    # Seeds 0 and 1 used to share only 121 of their 200 held-out questions; every seed is now
    # scored on the same 200, and trains on the same 995 (the seed only orders them).
    from mlx_grpo.data.load import load_rows

    assert load_rows("builtin:arithmetic", split="test", seed=0) == load_rows("builtin:arithmetic", split="test", seed=1)
    assert len(load_rows("builtin:arithmetic", split="test", seed=7)) == 200
    train = load_rows("builtin:arithmetic", split="train", seed=3)
    assert len(train) == len({r["question"] for r in train}) == 995
