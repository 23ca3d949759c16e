"""Faults during a run: NaN steps, a full disk, bad rewards, bad data and bad model folders."""

import errno
import json
import shutil
import sys

import mlx.core as mx
import mlx.optimizers as optim
import pytest
from mlx.utils import tree_flatten

from checks import one_line_error
from mlx_grpo import cli
from mlx_grpo.run.checkpoint import CheckpointError, save_checkpoint
from mlx_grpo.run.layout import list_checkpoints
from mlx_grpo.config import DataConfig, ModelConfig, load_config
from mlx_grpo.data.chat import plain_prompt
from mlx_grpo.data.load import DataError
from mlx_grpo.data.examples import load_examples
from mlx_grpo.errors import ModelError, TrainingError
from mlx_grpo.run.log import read_metrics
from mlx_grpo.models.load import check_model_folder, load_base
from mlx_grpo.rewards import RewardError, RewardSet
from mlx_grpo.commands.train import train

SMOKE = "configs/smoke_test.toml"


def _cfg(out, *extra):
    return load_config(SMOKE, [f'output_dir="{out}"', "training.prompts_per_step=2",
                               "generation.max_new_tokens=16", "checkpoint.save_every=1",
                               "training.learning_rate=1e-3", "logging.log_completions=0", *extra])


def test_nan_steps_are_skipped_up_to_max_bad_steps_then_stop_naming_step_metric_checkpoint(tmp_path, monkeypatch, capsys):
    import mlx_grpo.update.step as train_mod

    real, calls = train_mod.grpo_loss, []

    def poisoned(*args, **kwargs):  # one call per step here (one micro-batch, one iteration)
        calls.append(1)
        loss, metrics = real(*args, **kwargs)
        return (loss * float("nan") if len(calls) in (2, 3) else loss), metrics

    monkeypatch.setattr(train_mod, "grpo_loss", poisoned)
    # The poison counts Python calls; a compiled step runs grpo_loss's Python only when it traces.
    monkeypatch.setattr(train_mod, "COMPILE_STEP", False)
    out = tmp_path / "run"
    with pytest.raises(TrainingError) as e:
        train(_cfg(out, "training.max_steps=4", "training.max_bad_steps=1", "grpo.beta=0"))
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("step 3: non-finite loss (nan), the update was not applied; ")
    assert f"last good checkpoint {out / 'checkpoints' / 'step_000002'}" in message
    assert "training.max_bad_steps = 1" in message
    assert "step 2: non-finite loss (nan); update skipped (1 of training.max_bad_steps = 1)" in capsys.readouterr().out

    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert "loss" in rows[0] and "loss" not in rows[1] and "reward" in rows[1]  # skipped: no update metrics
    assert [p.name for p in list_checkpoints(out)] == ["step_000001", "step_000002"]
    one, two = (mx.load(str(p / "model.safetensors")) for p in list_checkpoints(out))
    assert all(mx.array_equal(one[k], two[k]).item() for k in one)  # step 2 was not applied
    opt_one, opt_two = (mx.load(str(p / "optimizer.safetensors")) for p in list_checkpoints(out))
    assert opt_one["step"].item() == opt_two["step"].item() == 1
    assert json.loads((out / "checkpoints" / "step_000002" / "trainer_state.json").read_text())["bad_steps"] == 1


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   RuntimeError("[write] Unable to write 8 bytes to file.")])
def test_disk_full_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch, tiny, tiny_path, error):
    model, tokenizer = tiny
    optimizer = optim.AdamW(learning_rate=1e-3)
    optimizer.init(model.trainable_parameters())
    cfg = load_config(None, [f'output_dir="{tmp_path}"'])
    save = lambda step: save_checkpoint(
        tmp_path, step, model=model, tokenizer=tokenizer, optimizer=optimizer, cfg=cfg,
        base_path=tiny_path, num_layers=4, trainer_state={"data_position": 0}, keep_last=3,
    )
    first = save(1)
    saved = sorted(p.name for p in first.iterdir())

    def full(*args, **kwargs):
        raise error

    monkeypatch.setattr(mx, "save_safetensors", full)
    with pytest.raises(CheckpointError) as e:
        save(2)
    tmp = tmp_path / "checkpoints" / "step_000002.tmp"
    reason = "No space left on device" if isinstance(error, OSError) else "[write] Unable to write 8 bytes to file."
    assert str(e.value) == f"checkpoint: cannot write step 2 to {tmp} ({reason}); the previous checkpoint {first} is intact"
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]
    assert sorted(p.name for p in first.iterdir()) == saved
    weights = mx.load(str(first / "model.safetensors"))
    assert all(mx.array_equal(weights[k], v).item() for k, v in tree_flatten(model.parameters()))


def _full_disk_at(monkeypatch, name):
    """A write of `name` fails as on a full disk: an OSError that names no file (write() errors do not)."""
    import os
    from pathlib import Path

    if name == ".lock":
        def pwrite(*args):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwrite", pwrite)
        return
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name.startswith(name):  # config.toml is written as config.toml.tmp, then renamed
            real(self, "partly")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)


@pytest.mark.parametrize("name", [".lock", "config.toml", "metrics.jsonl", "completions.jsonl"])
def test_a_full_disk_at_the_start_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys, name):
    _full_disk_at(monkeypatch, name)
    out = tmp_path / "run"
    assert cli.main(["--config", SMOKE, "--set", f'output_dir="{out}"', "--set", "grpo.beta=0"]) == 2
    err = capsys.readouterr().err
    assert err == f"mlx-grpo: error: [Errno 28] No space left on device: '{out / name}'\n"
    assert not list(tmp_path.glob("**/*.tmp"))
    if name in (".lock", "config.toml"):  # nothing was written: the folder it made is gone
        assert not out.exists()


def test_reward_error_names_reward_prompt_index_and_completion():
    def picky(prompts, completions, answers, **kw):
        return [float("nan") if c.startswith("bad") else 1.0 for c in completions]

    rewards = RewardSet([("gsm8k_correctness", 1.0)], group_size=4)
    rewards.fns["gsm8k_correctness"] = picky
    completions = ["ok"] * 5 + ["bad " + "x" * 200] + ["ok"] * 2
    with pytest.raises(RewardError) as e:
        rewards(["q"] * 8, completions, ["a"] * 8)
    message = str(e.value)
    assert message.startswith("reward 'gsm8k_correctness' gave nan (float) for sample 5 (prompt 1, completion 'bad xxx")
    assert "x" * 76 + "')" in message and "x" * 77 not in message  # the first 80 characters
    assert "\n" not in message


def test_fewer_prompts_than_a_step_needs_stops_before_writing(tmp_path, capsys):
    out = tmp_path / "run"
    # 808 sequences of up to 1024 tokens in one micro-batch: the memory plan refuses it first
    code = cli.main(["--config", SMOKE, "--ignore-memory", "--set", f'output_dir="{out}"', "--set", 'data.split="test"',
                     "--set", "training.prompts_per_step=101", "--set", "training.gradient_accumulation_steps=2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("mlx-grpo: error: data.dataset: 200 usable prompts, fewer than the 202 one step needs")
    assert not out.exists()


def test_non_text_field_and_unknown_split_are_one_line_errors(tmp_path, tiny):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"q": "fine", "a": "1"}\n{"q": 17, "a": "2"}\n')
    with pytest.raises(DataError, match=r"row 1 field 'q' must be non-empty text, got 17$"):
        load_examples(DataConfig(dataset=str(path), prompt_field="q", answer_field="a"), tiny[1])
    with pytest.raises(DataError, match=r"^data.split: builtin:arithmetic has splits train, test, not 'dev'$"):
        load_examples(DataConfig(split="dev"), tiny[1])


def _copy_model(src, dst, drop=()):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*drop))
    return str(dst)


def test_tokenizer_without_chat_template_falls_back_to_plain_prompts(tmp_path, tiny_path, capsys):
    import mlx_lm

    folder = _copy_model(tiny_path, tmp_path / "model")
    config_file = tmp_path / "model" / "tokenizer_config.json"
    tok_cfg = json.loads(config_file.read_text())
    del tok_cfg["chat_template"]
    config_file.write_text(json.dumps(tok_cfg))
    _, tokenizer = mlx_lm.load(folder)
    examples = load_examples(DataConfig(system_prompt="Be brief."), tokenizer, seed=1)
    assert "has no chat template" in capsys.readouterr().err
    first = examples[0]
    assert first.prompt == plain_prompt(first.question, "Be brief.")
    assert first.prompt == f"Be brief.\n\nUser: {first.question}\nAssistant:"


def test_model_folders_without_tokenizer_or_safetensors_are_refused(tmp_path, tiny_path):
    no_tok = _copy_model(tiny_path, tmp_path / "no_tok", drop=("tokenizer*",))
    with pytest.raises(ModelError, match=r"has no tokenizer \(expected one of tokenizer.json"):
        check_model_folder(no_tok)
    pickled = _copy_model(tiny_path, tmp_path / "pickled", drop=("*.safetensors*",))
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"not a pickle: loading it would fail loudly")
    with pytest.raises(ModelError, match=r"no model\*.safetensors weights \(found pytorch_model.bin: pickle"):
        load_base(ModelConfig(path=pickled))
    with pytest.raises(ModelError, match="folder './nowhere' does not exist"):
        load_base(ModelConfig(path="./nowhere"))


def test_trust_remote_code_is_off_unless_set(monkeypatch, tiny_path):
    import mlx_grpo.models.load as model_mod

    seen = []
    real = model_mod.mlx_lm.load

    def spy(path, **kwargs):
        seen.append(kwargs)
        return real(path, **kwargs)

    monkeypatch.setattr(model_mod.mlx_lm, "load", spy)
    _, _, local = load_base(ModelConfig(path=tiny_path))
    load_base(ModelConfig(path=tiny_path), local)  # the second copy, as for a reference model
    assert seen == [{"tokenizer_config": {"trust_remote_code": False}, "trust_remote_code": False}] * 2
    assert load_config(None).model.trust_remote_code is False
    seen.clear()
    load_base(ModelConfig(path=tiny_path, trust_remote_code=True))
    assert seen == [{"tokenizer_config": {"trust_remote_code": True}, "trust_remote_code": True}]


def test_custom_reward_files_are_imported_only_when_named(tmp_path):
    marker = tmp_path / "imported"
    (tmp_path / "mine.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "def short(prompts, completions, answers, **kw):\n"
        "    return [1.0 / (1 + len(c)) for c in completions]\n"
    )
    RewardSet.from_config([{"name": "xml_format", "weight": 1.0}], base_dir=tmp_path)
    assert not marker.exists()
    assert not [m for m in sys.modules if m.startswith("_mlx_grpo_user_mine_")]
    rewards = RewardSet.from_config([{"name": "mine.py:short", "weight": 1.0}], base_dir=tmp_path)
    assert marker.exists()
    assert rewards(["q"], ["abc"], ["a"])[0] == [0.25]


def tokenizer_past_the_embedding(tiny_path, dst) -> tuple[str, int]:
    """A copy of tiny whose tokenizer gained "<tool_call>" after the model was saved: (the folder,
    the token's id, the first row the embedding lacks)."""
    folder = _copy_model(tiny_path, dst)
    tok_file = dst / "tokenizer.json"
    tok = json.loads(tok_file.read_text())
    rows = 1 + max(*tok["model"]["vocab"].values(), *(t["id"] for t in tok["added_tokens"]))  # tiny embeds these
    tok["added_tokens"].append({"id": rows, "content": "<tool_call>", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": False})
    tok_file.write_text(json.dumps(tok))
    return folder, rows


def test_a_prompt_token_past_the_embedding_is_refused_naming_the_row(tmp_path, tiny_path):
    from mlx_grpo.commands.setup import setup

    folder, rows = tokenizer_past_the_embedding(tiny_path, tmp_path / "model")
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n"
                            for q in ("What is 1 + 0?", "Call <tool_call> for 2 + 3?")))
    cfg = load_config(None, [f'model.path="{folder}"', f'data.dataset="{data}"'])
    with pytest.raises(DataError, match=rf"token id {rows} in the prompt of data row 1, but the model's "
                                        rf"embedding has {rows} rows"):
        setup(cfg, total_updates=1)
    data.write_text(json.dumps({"question": "What is 1 + 0?", "answer": "1"}) + "\n")
    assert len(setup(cfg, total_updates=1).examples) == 1  # the same model without that token trains


def test_an_eval_prompt_past_the_embedding_is_refused_before_the_first_step(tmp_path, tiny_path, capsys):
    # Evaluated at step N of a run, it would crash there: refused when the run starts, and by `eval`.
    folder, rows = tokenizer_past_the_embedding(tiny_path, tmp_path / "model")
    files = {"train": ["What is 1 + 0?"], "test": ["What is 2 + 3?", "Call <tool_call> for 2 + 3?"]}
    for split, questions in files.items():
        (tmp_path / f"{split}.jsonl").write_text(
            "".join(json.dumps({"question": q, "answer": "#### 5"}) + "\n" for q in questions))
    table = "data.dataset={" + ", ".join(f'{k} = "{tmp_path / k}.jsonl"' for k in files) + "}"
    profile = tmp_path / "p.toml"
    profile.write_text(f'[model]\npath = "{folder}"\n[eval]\nevery = 5\n')
    assert cli.main(["train", "--config", str(profile), "--set", table, "--set", f"output_dir={tmp_path / 'run'}",
                     "--set", "training.max_steps=1"]) == 2
    one_line_error(capsys, f"model.path: {folder}'s tokenizer gives token id {rows} in the prompt of data row 1 "
                           "of split 'test'")
    assert not list_checkpoints(tmp_path / "run")
    assert cli.main(["eval", "--model", folder, "--config", str(profile), "--set", table]) == 2
    one_line_error(capsys, f"--model {folder}'s tokenizer gives token id {rows}", "of split 'test'")


def test_a_tool_run_with_a_tokenizer_past_the_embedding_is_refused_at_setup(tmp_path, tiny_path):
    # A tool's output is any text, so the token could come mid-run: refused before the first step.
    from mlx_grpo.commands.setup import setup
    from mlx_grpo.tools import make_toolset

    folder, rows = tokenizer_past_the_embedding(tiny_path, tmp_path / "model")
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"question": "What is 1 + 0?", "answer": "1"}) + "\n")
    cfg = load_config(None, [f'model.path="{folder}"', f'data.dataset="{data}"',
                             'tools.functions=["examples/calculator_tools.py:calculator"]'])
    with pytest.raises(ModelError, match=rf"tokenizer has token ids up to {rows}, but the model's embedding has "
                                         rf"{rows} rows \(0-{rows - 1}\), and a tool's output"):
        setup(cfg, total_updates=1, toolset=make_toolset(cfg))
    cfg = load_config(None, [f'model.path="{tiny_path}"', f'data.dataset="{data}"',
                             'tools.functions=["examples/calculator_tools.py:calculator"]'])
    assert setup(cfg, total_updates=1, toolset=make_toolset(cfg)).tools is not None  # its own tokenizer fits


def test_generate_and_chat_refuse_a_prompt_past_the_embedding_and_chat_goes_on(tmp_path, tiny_path):
    import io

    import mlx_lm

    from mlx_grpo.commands.chat import ChatSession, chat_loop
    from mlx_grpo.commands.generate import generate_answer

    folder, rows = tokenizer_past_the_embedding(tiny_path, tmp_path / "model")
    model, tokenizer = mlx_lm.load(folder)
    with pytest.raises(ModelError, match=rf"the prompt encodes to token id {rows}, but the model's embedding "
                                         rf"has {rows}"):
        generate_answer(model, tokenizer, "Call <tool_call> for 2 + 3?", max_tokens=4)
    assert generate_answer(model, tokenizer, "What is 2 + 3?", max_tokens=4).num_tokens > 0
    session = ChatSession(model, tokenizer, max_tokens=4)
    lines, out = iter(["Call <tool_call> now", "What is 2 + 3?", "/quit"]), io.StringIO()
    chat_loop(session, read=lambda _: next(lines), out=out)
    assert f"error: the prompt encodes to token id {rows}" in out.getvalue()
    assert [m["content"] for m in session.messages if m["role"] == "user"] == ["What is 2 + 3?"]
