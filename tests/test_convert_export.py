"""convert from a local Hugging Face folder, export of trained runs, resolving --model M, and
serving both with mlx_lm.server."""

import json
from pathlib import Path
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import pytest

from mlx_grpo.cli import main
from mlx_grpo.config import load_config
from mlx_grpo.errors import ModelError
from mlx_grpo.models.named import load_model
from mlx_grpo.data.chat import DEFAULT_SYSTEM_PROMPT

X = mx.array([[5, 17, 42, 99, 3]])


def test_convert_local_hf_folder_refuses_a_non_empty_destination(tmp_path, tiny_path, tiny, capsys):
    dst = tmp_path / "tiny-mlx"
    dst.mkdir()  # an empty folder is fine
    assert main(["convert", "--hf-path", tiny_path, "--mlx-path", str(dst)]) == 0
    assert "[INFO]" not in capsys.readouterr().out  # mlx-lm's progress lines are not ours to print
    converted, _ = mlx_lm.load(str(dst))
    assert mx.array_equal(converted(X), tiny[0](X)).item()

    assert main(["convert", "--hf-path", tiny_path, "--mlx-path", str(dst), "--quantize", "--q-bits", "8"]) == 2
    assert capsys.readouterr().err.strip().endswith("folder is not empty; pass --force to replace it")
    assert "quantization" not in json.loads((dst / "config.json").read_text())  # left as it was

    assert main(["convert", "--hf-path", tiny_path, "--mlx-path", str(dst), "--force",
                 "--quantize", "--q-bits", "8", "--q-group-size", "32"]) == 0
    assert json.loads((dst / "config.json").read_text())["quantization"]["bits"] == 8
    assert "[INFO]" not in capsys.readouterr().out  # nor "[INFO] Quantized model with ..."
    quantized, _ = mlx_lm.load(str(dst))
    assert isinstance(quantized.layers[0].mlp.down_proj, nn.QuantizedLinear)
    assert not list(tmp_path.glob(".tiny-mlx.tmp*"))


def test_model_spec_resolves_runs_checkpoints_and_adapters(lora_run, tiny_path):
    step2 = lora_run / "checkpoints" / "step_000002"
    run = load_model(str(lora_run))
    assert run.checkpoint == step2 and run.run_dir == lora_run
    assert run.system_prompt == load_config(step2 / "config.toml").data.system_prompt == DEFAULT_SYSTEM_PROMPT
    ckpt1 = load_model(str(lora_run / "checkpoints" / "step_000001"))
    base_plus = load_model(tiny_path, adapter=str(step2))
    assert base_plus.checkpoint == step2 and base_plus.system_prompt == DEFAULT_SYSTEM_PROMPT
    assert mx.allclose(run.model(X), base_plus.model(X)).item()
    assert not mx.allclose(run.model(X), ckpt1.model(X)).item()
    assert load_model("builtin:tiny").system_prompt == DEFAULT_SYSTEM_PROMPT
    assert load_model(tiny_path).system_prompt == ""  # a plain folder says nothing about its prompt
    with pytest.raises(ModelError, match="already carries an adapter"):
        load_model(str(lora_run), adapter=str(step2))
    with pytest.raises(ModelError, match="not an adapter folder"):
        load_model(tiny_path, adapter=tiny_path)


def test_run_without_checkpoints_is_refused(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ModelError, match="has no complete checkpoint yet"):
        load_model(str(tmp_path))


def test_export_lora_run_is_a_standalone_mlx_lm_model(lora_run, tmp_path):
    out = tmp_path / "exported"
    assert main(["export", str(lora_run), "--out", str(out)]) == 0
    assert not (out / "adapter_config.json").exists() and (out / "config.toml").exists()
    fused, tokenizer = mlx_lm.load(str(out))
    assert not any("lora" in name for name, _ in fused.named_modules())
    trained = load_model(str(lora_run))
    assert mx.allclose(fused(X), trained.model(X), atol=1e-4).item()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 1 + 1?"}],
                                           add_generation_prompt=True, tokenize=False)
    assert isinstance(mlx_lm.generate(fused, tokenizer, prompt, max_tokens=8), str)
    assert load_model(str(out)).system_prompt == DEFAULT_SYSTEM_PROMPT  # from the copied config.toml


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"),
                                   RuntimeError("[write] Unable to write 8 bytes to file.")])
def test_export_onto_a_full_disk_is_one_line_and_leaves_nothing(lora_run, tmp_path, monkeypatch, capsys, error):
    """MLX reports a failed write as a RuntimeError, which was a traceback."""
    from checks import one_line_error

    def full(*args, **kwargs):
        raise error

    monkeypatch.setattr(mx, "save_safetensors", full)
    out = tmp_path / "exported"
    capsys.readouterr()
    assert main(["export", str(lora_run), "--out", str(out)]) == 2
    reason = "No space left on device" if isinstance(error, OSError) else "[write] Unable to write 8 bytes to file."
    one_line_error(capsys, f"--out {out}: cannot write the model ({reason}); nothing was left there or beside it")
    assert list(tmp_path.iterdir()) == []


def test_convert_onto_a_full_disk_is_one_line_and_leaves_nothing(tiny_path, tmp_path, monkeypatch, capsys):
    from checks import one_line_error

    def full(*args, **kwargs):
        raise RuntimeError("[write] Unable to write 8 bytes to file.")

    monkeypatch.setattr(mx, "save_safetensors", full)
    dst = tmp_path / "converted"
    capsys.readouterr()
    assert main(["convert", "--hf-path", tiny_path, "--mlx-path", str(dst)]) == 2
    one_line_error(capsys, f"--mlx-path {dst}: converting {tiny_path} failed ([write] Unable to write 8 bytes "
                           "to file.); nothing was left there or beside it")
    assert list(tmp_path.iterdir()) == []


def test_export_removes_the_temporary_folder_a_killed_export_left(lora_run, tmp_path):
    out = tmp_path / "exported"
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for proc in (killed, alive):  # as a SIGKILL during `export` leaves them: the size of a model
            (tmp_path / f".exported.tmp{proc.pid}").mkdir()
            (tmp_path / f".exported.tmp{proc.pid}" / "model.safetensors").write_bytes(b"\0" * 4096)
        killed.kill()
        killed.wait()
        assert main(["export", str(lora_run), "--out", str(out)]) == 0
        # an export still running (the live process) keeps its folder
        assert sorted(p.name for p in tmp_path.iterdir()) == [f".exported.tmp{alive.pid}", "exported"]
    finally:
        alive.kill()
        alive.wait()


def test_export_qlora_keeps_or_drops_quantization(tmp_path):
    from mlx_grpo.commands.train import train

    cfg = load_config("configs/smoke_test.toml", [
        "training.max_steps=1", "training.prompts_per_step=2", "generation.max_new_tokens=16",
        "lora.enabled=true", "lora.rank=4", "model.quantize_bits=4", "model.quantize_group_size=32",
        "training.learning_rate=1e-2", f'output_dir="{tmp_path / "run"}"',
    ])
    ckpt = train(cfg)
    trained = load_model(str(ckpt))
    for flag, quantized in (([], True), (["--dequantize"], False)):
        out = tmp_path / f"out{len(flag)}"
        assert main(["export", str(ckpt), "--out", str(out), *flag]) == 0
        assert ("quantization" in json.loads((out / "config.json").read_text())) == quantized
        model, _ = mlx_lm.load(str(out))
        assert isinstance(model.layers[0].self_attn.q_proj, nn.QuantizedLinear) == quantized
        if not quantized:  # exact fuse of the dequantized base; re-quantizing adds its own rounding
            assert mx.allclose(model(X), trained.model(X), atol=1e-3).item()


def test_full_checkpoint_of_a_run_loads_with_its_system_prompt(tmp_path, tiny_path):
    import shutil

    from mlx_grpo.config import save_config

    ckpt = tmp_path / "run" / "checkpoints" / "step_000007"
    shutil.copytree(tiny_path, ckpt)  # a full checkpoint is a model folder plus the run's files
    save_config(load_config(None, ['data.system_prompt="Answer briefly."']), ckpt / "config.toml")
    (ckpt / "trainer_state.json").write_text('{"step": 7}')
    loaded = load_model(str(tmp_path / "run"))
    assert loaded.checkpoint == ckpt and loaded.system_prompt == "Answer briefly."
    assert loaded.base_path == str(ckpt) and loaded.run_dir == tmp_path / "run"


def _serve_one_chat(tmp_path, *server_args, system: str | None = None) -> dict:
    """Start mlx_lm.server as a user would, send one chat completion, return its JSON reply."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    with socket.socket() as s:  # a free port: bind to 0 and let the OS pick
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "mlx_lm", "server", *server_args, "--port", str(port)],
                              stdout=log, stderr=subprocess.STDOUT)
    messages.append({"role": "user", "content": "What is 1 + 1?"})
    body = json.dumps({"messages": messages, "max_tokens": 16,
                       "temperature": 0.0}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            try:
                with urllib.request.urlopen(request, timeout=60) as reply:
                    return json.loads(reply.read())
            except (ConnectionError, urllib.error.URLError):
                assert time.monotonic() < deadline, "mlx_lm.server did not answer within 120 s"
                time.sleep(0.5)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_mlx_lm_server_serves_an_export_and_a_lora_checkpoint(lora_run, tiny_path, tmp_path, capsys):
    out = tmp_path / "exported"
    assert main(["export", str(lora_run), "--out", str(out)]) == 0
    step2 = lora_run / "checkpoints" / "step_000002"
    fused = _serve_one_chat(tmp_path, "--model", str(out))
    # The export's template supplies the run's system prompt; the base's does not, so a user of the
    # adapter sends it (models/saved_template.py).
    adapted = _serve_one_chat(tmp_path, "--model", tiny_path, "--adapter-path", str(step2),
                              system=DEFAULT_SYSTEM_PROMPT)
    for reply in (fused, adapted):
        assert reply["choices"][0]["message"]["role"] == "assistant"
        assert reply["usage"]["completion_tokens"] > 0
    # Greedy, and the fused weights equal base + adapter to float precision: the same answer.
    answer = fused["choices"][0]["message"]["content"]
    print("mlx_lm.server answered", repr(answer))
    assert answer == adapted["choices"][0]["message"]["content"]
    capsys.readouterr()
    assert main(["generate", "--model", str(out), "--prompt", "What is 1 + 1?", "--max-tokens", "16"]) == 0
    assert capsys.readouterr().out.removesuffix("\n") == answer


def _mlx_lm_answer(folder, question: str, max_tokens: int = 32) -> str:
    """What a user of mlx-lm gets: load the folder, chat template over the user message only."""
    model, tokenizer = mlx_lm.load(str(folder))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    return mlx_lm.generate(model, tokenizer, prompt, max_tokens=max_tokens)


def test_mlx_lm_and_mlx_grpo_generate_answer_alike_from_checkpoint_and_export(lora_run, tmp_path, capsys):
    """The saved chat template carries the run's system prompt, which mlx-lm users never send."""
    from mlx_grpo.commands.train import train
    from mlx_grpo.data.arithmetic import make_problems

    ckpt = train(load_config("configs/smoke_test.toml", [
        "training.max_steps=1", "training.prompts_per_step=2", "generation.max_new_tokens=16",
        f'output_dir="{tmp_path / "full"}"',
    ]))
    assert "A full fine-tune of `" in (ckpt / "README.md").read_text()  # mlx-grpo's card, not mlx-lm's
    exported = tmp_path / "exported"
    assert main(["export", str(lora_run), "--out", str(exported)]) == 0
    questions = [row["question"] for row in make_problems(4, seed=3, split="test")]
    for folder in (ckpt, exported):
        for question in questions:
            capsys.readouterr()
            assert main(["generate", "--model", str(folder), "--prompt", question, "--max-tokens", "32"]) == 0
            ours = capsys.readouterr().out.removesuffix("\n")
            assert _mlx_lm_answer(folder, question) == ours, (folder, question)
    # A conversation with its own system message keeps it: the template adds none.
    _, tokenizer = mlx_lm.load(str(exported))
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False).count("<|im_start|>system") == 1
    assert DEFAULT_SYSTEM_PROMPT not in tokenizer.apply_chat_template(messages, tokenize=False)


def test_adapter_config_names_a_loadable_base_and_checkpoints_carry_a_model_card(lora_run, tiny_path):
    step2 = lora_run / "checkpoints" / "step_000002"
    base = json.loads((step2 / "adapter_config.json").read_text())["base_model"]
    assert not base.startswith("builtin:") and base == str(Path(tiny_path).resolve())
    model, _ = mlx_lm.load(base, adapter_path=str(step2))  # what a user of mlx-lm does with it
    assert mx.allclose(model(X), load_model(str(lora_run)).model(X)).item()

    card = (step2 / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: mlx\n") and f"base_model: {base}\n" in card
    assert "started with: `" in card and "mlx-grpo train --config CHECKPOINT/config.toml" in card
    assert "--adapter-path CHECKPOINT" in card and "--system-prompt" in card
    metrics = [json.loads(line) for line in (lora_run / "metrics.jsonl").read_text().splitlines()]
    assert f"| `reward` | {metrics[1]['reward']:.4g} |" in card
    assert (step2 / "config.toml").read_text().strip() in card
    assert "README.md" in json.loads((step2 / "checkpoint_manifest.json").read_text())


def test_saved_template_adds_the_system_prompt_and_gives_plain_text_where_there_was_none(tmp_path, tiny_path):
    import shutil

    from mlx_grpo.data.chat import conversation, plain_text
    from mlx_grpo.models.saved_template import write_system_prompt

    system = 'Say "4", then\nstop {{ not jinja }} \u00e9'
    question = [{"role": "user", "content": "What is 2 + 2?"}]
    with_template, without = tmp_path / "with", tmp_path / "without"
    shutil.copytree(tiny_path, with_template)
    shutil.copytree(tiny_path, without)
    config = json.loads((without / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (without / "tokenizer_config.json").write_text(json.dumps(config))
    for folder in (with_template, without):
        write_system_prompt(folder, "an earlier run's prompt")
        write_system_prompt(folder, system)  # saved again (an export of a checkpoint): replaced, not stacked
        _, tokenizer = mlx_lm.load(str(folder))
        render = lambda messages: tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert render(question) == render(conversation(system, question[0]["content"]))
        assert render(question).count(system) == 1 and "earlier run" not in render(question)
    _, tokenizer = mlx_lm.load(str(without))
    messages = conversation(system, "What is 2 + 2?") + [{"role": "assistant", "content": "4"},
                                                        {"role": "user", "content": "And 3 + 3?"}]
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == plain_text(messages)
