"""Damaged inputs a run is started on (issue 19): data files, model folders, paths that do not
exist and hub ids with no hub. Each is one line naming the setting, never a traceback; each case
is a unit call or a train/eval that stops before its first step."""

from pathlib import Path

import pytest

from checks import one_line_error as _one_line_error
from mlx_grpo import cli

SMOKE = str(Path(__file__).parent.parent / "configs" / "smoke_test.toml")


# --- data files -------------------------------------------------------------------------------

DATA = {  # name: (file name, its bytes or None for a folder, what the line says)
    "empty jsonl": ("d.jsonl", b"", "is empty"),
    "empty csv": ("d.csv", b"", "is empty"),
    "blank lines only": ("d.jsonl", b"\n  \n\n", "is empty"),
    "header-only csv": ("d.csv", b"prompt,answer\n", "header line and no rows"),
    "latin-1 jsonl": ("d.jsonl", b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n',
                      "line 2 is not UTF-8"),
    "latin-1 csv": ("d.csv", b"prompt,answer\na,1\nb,2\ncaf\xe9,3\n", "line 4 is not UTF-8"),
    "broken json line": ("d.jsonl", b'{"prompt": "a", "answer": "1"}\n{"prompt": "b", "ans\n', "cannot be read"),
    "a folder": ("d.jsonl", None, "is a folder"),
}


def _write(tmp_path, name):
    file_name, data, _ = DATA[name]
    path = tmp_path / file_name
    if data is None:
        path.mkdir()
    else:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", DATA)
def test_a_damaged_data_file_is_one_line_naming_it(tmp_path, capsys, name):
    from mlx_grpo.data.load import DataError, load_rows

    path = _write(tmp_path, name)
    with pytest.raises(DataError) as e:
        load_rows(str(path))
    assert str(e.value).startswith(f"data.dataset: {str(path)!r}") and DATA[name][2] in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("command", ["train", "eval"])
@pytest.mark.parametrize("name", ["empty jsonl", "latin-1 csv", "a folder"])
def test_train_and_eval_on_a_damaged_data_file_are_one_line(tmp_path, capsys, command, name):
    path = _write(tmp_path, name)
    sets = ["--set", f'data.dataset="{path}"', "--set", f'output_dir="{tmp_path / "run"}"']
    argv = [command, "--config", SMOKE, *sets]
    if command == "eval":
        argv += ["--split", "train", "--limit", "1", "--max-tokens", "2"]
    assert cli.main(argv) == 2
    _one_line_error(capsys, "data.dataset", str(path), DATA[name][2])
    assert not (tmp_path / "run").exists()


# --- model folders ----------------------------------------------------------------------------

def _garbage_config(folder):
    (folder / "config.json").write_text('{"model_type": "qwen2", "hidden_size": ')


def _unknown_model_type(folder):
    _edit_config(folder, model_type="no_such_arch")


def _other_architecture(folder):  # llama has no attention biases: qwen2's weights do not fit
    _edit_config(folder, model_type="llama")


def _other_shape(folder):  # the weights of a 128-wide model under a 256-wide config
    _edit_config(folder, hidden_size=256, intermediate_size=768)


def _edit_config(folder, **changes):
    import json

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


MODEL_DAMAGE = {"garbage config.json": _garbage_config, "unknown model_type": _unknown_model_type,
                "weights of another architecture": _other_architecture,
                "weights of another shape": _other_shape}


def _train(tmp_path, *sets):
    items = [*sets, f'output_dir="{tmp_path / "run"}"', "training.max_steps=1"]
    return cli.main(["train", "--config", SMOKE, *[a for item in items for a in ("--set", item)]])


@pytest.mark.parametrize("name", MODEL_DAMAGE)
def test_training_on_a_damaged_model_folder_is_one_line_naming_model_path(tmp_path, tiny_path, capsys, name):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_path, folder)
    MODEL_DAMAGE[name](folder)
    assert _train(tmp_path, f'model.path="{folder}"') == 2
    _one_line_error(capsys, "model.path", str(folder))
    assert not (tmp_path / "run").exists()


# --- paths that do not exist, hub ids with no hub ---------------------------------------------

@pytest.mark.parametrize("value", ["models/x", "./x", "no/such/folder", "~/no-such-model-folder"])
def test_a_missing_local_model_path_is_a_missing_folder_not_a_hub_error(tmp_path, capsys, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert _train(tmp_path, f'model.path="{value}"', f'data.dataset="{_data(tmp_path)}"') == 2
    _one_line_error(capsys, f"model.path: folder {value!r} does not exist")


@pytest.mark.parametrize("value", ["models/x", "./x", "no/such/folder"])
def test_plan_and_train_call_a_missing_local_model_path_a_missing_folder_in_one_line(tmp_path, capsys, monkeypatch,
                                                                                   value):
    """plan said 'models/x is neither a local folder nor in the Hugging Face cache
    (LocalEntryNotFoundError); download it first', and train printed that as 'memory not checked'
    before the loader's line: a local-looking path is a missing folder there too (issue 26)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    assert cli.main(["plan", "--config", SMOKE, "--set", f'model.path="{value}"']) == 2
    line = _one_line_error(capsys, f"model.path: folder {value!r} does not exist")
    assert _train(tmp_path, f'model.path="{value}"', f'data.dataset="{_data(tmp_path)}"') == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [line], err  # no 'memory not checked' line before it


def _data(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "1+1", "answer": "2"}\n')
    return path


def test_a_hub_model_id_with_no_hub_fails_fast_naming_model_path(tmp_path, capsys, monkeypatch):
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tic = time.monotonic()
    assert _train(tmp_path, 'model.path="nobody/no-such-model"') == 2
    assert time.monotonic() - tic < 10
    _one_line_error(capsys, "model.path: cannot load 'nobody/no-such-model' from the hub")


@pytest.mark.parametrize("value", ["nobody/no-such-data", "./no-such-data"])
def test_a_data_set_that_is_not_there_fails_fast_naming_data_dataset(tmp_path, capsys, monkeypatch, value):
    import time

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tic = time.monotonic()
    assert _train(tmp_path, f'data.dataset="{value}"') == 2
    assert time.monotonic() - tic < 10
    needle = "from the hub" if value.startswith("nobody") else "does not exist"
    _one_line_error(capsys, "data.dataset", value, needle)


@pytest.mark.parametrize("key", ["model.path", "data.dataset"])
def test_a_hub_id_in_offline_mode_is_one_line_in_a_fresh_process(tmp_path, key):
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # read when the hub client is imported
    tic = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mlx_grpo", "train", "--config", SMOKE,
                           "--set", f'{key}="nobody/no-such-thing"', "--set", f'output_dir="{tmp_path / "run"}"'],
                          env=env, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - tic < 30  # the interpreter and its imports take most of it
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"mlx-grpo: error: {key}: cannot load 'nobody/no-such-thing' from the hub" in done.stderr


def test_convert_of_a_hub_id_in_offline_mode_is_trains_one_line_naming_hf_path(tmp_path):
    """Issue 26: `convert --hf-path` offline gives the same one line as train's, naming --hf-path
    (it was '--mlx-path ...: converting ... failed', the line of a full disk)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}  # an empty cache
    done = subprocess.run([sys.executable, "-m", "mlx_grpo", "convert", "--hf-path", "nobody/no-such-thing",
                           "--mlx-path", str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("mlx-grpo: error: --hf-path: cannot load 'nobody/no-such-thing' from the hub ("), lines[0]
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp*"))


# --- report on a damaged metrics.jsonl --------------------------------------------------------

@pytest.mark.extra
def test_report_skips_damaged_metrics_lines_with_a_warning_naming_them(tmp_path, capsys):
    import json

    pytest.importorskip("matplotlib", reason="report draws with matplotlib, the optional `plot` extra")

    rows = [json.dumps({"step": s, "reward": 0.1 * s, "step_time": 1.0, "peak_memory_gb": 0.5}) for s in range(1, 7)]
    rows[2] = '{"step": 3, "rew\xff'  # bad JSON, and not UTF-8 once encoded
    rows[4] = "[5]"  # JSON, but not a row
    (tmp_path / "metrics.jsonl").write_bytes("\n".join(rows).encode("latin-1") + b'\n{"step": 7, "re')
    assert cli.main(["report", str(tmp_path), "--out", str(tmp_path / "r.png")]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and (tmp_path / "r.png").stat().st_size > 0
    assert f"mlx-grpo: warning: {tmp_path / 'metrics.jsonl'}: skipped damaged lines 3, 5, 7" in err


# --- sizes no Mac can hold --------------------------------------------------------------------

@pytest.mark.parametrize("item", ["generation.num_generations=100000", "generation.max_new_tokens=10000000",
                                  "data.max_prompt_tokens=10000000", "training.prompts_per_step=1000000",
                                  "lora.rank=100000", "eval.num_samples=100000"])
def test_a_size_no_mac_can_hold_is_refused_naming_the_key(item):
    from mlx_grpo.config import ConfigError, load_config

    key, value = item.split("=")
    with pytest.raises(ConfigError, match=rf"^--set {item}: {key} must be in \[\d+, \d+\].*, got {value}$"):
        load_config(SMOKE, [item])  # refused at load: the CLI prints it as one line


@pytest.fixture
def silent_hub(monkeypatch):
    """A hub that accepts connections and never answers (a captive portal, a dead proxy): the
    kernel queues the connection, nobody reads it. HF_HUB_OFFLINE is off."""
    import socket

    from huggingface_hub import constants

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield
    server.close()


@pytest.mark.parametrize("key", ["model.path", "data.dataset"])
def test_a_hub_id_with_a_hub_that_never_answers_fails_within_seconds(tmp_path, capsys, silent_hub, key):
    import time

    import mlx_grpo.commands.train  # noqa: F401  imports (10 s on a busy machine) are not the hub's time
    from mlx_grpo.config.hub import TIMEOUT_S

    tic = time.monotonic()
    assert _train(tmp_path, f'{key}="nobody/no-such-thing"') == 2
    took = time.monotonic() - tic
    assert TIMEOUT_S <= took < 2 * TIMEOUT_S + 5, took  # mlx-lm alone waited 200 s here
    _one_line_error(capsys, f"{key}: cannot load 'nobody/no-such-thing' from the hub, which cannot be reached")


def test_a_cached_hub_model_loads_from_the_cache_when_the_hub_never_answers(tmp_path, tiny_path, capsys,
                                                                           silent_hub, monkeypatch):
    import shutil

    from huggingface_hub import constants

    from mlx_grpo.config import ModelConfig
    from mlx_grpo.models.load import load_base

    repo = tmp_path / "hub" / "models--nobody--cached-tiny"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_path, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    model, _, local = load_base(ModelConfig(path="nobody/cached-tiny", dtype="float32"))
    assert local == str(snapshot) and model.args.hidden_size == 128
    assert f"model.path 'nobody/cached-tiny' loads from the cache, {snapshot}" in capsys.readouterr().err


# --- a model named on the command line that is not there --------------------------------------

_MODEL_COMMANDS = {  # the command line before the model, and the flag its errors must name
    "eval": (["eval", "--limit", "1", "--model"], "--model"),
    "generate": (["generate", "--prompt", "hi", "--model"], "--model"),
    "chat": (["chat", "--model"], "--model"),
    "export": (["export", "--out", "exported"], "export"),
    "convert": (["convert", "--mlx-path", "converted", "--hf-path"], "--hf-path"),
}


@pytest.mark.parametrize("command", list(_MODEL_COMMANDS))
def test_a_missing_local_model_is_one_line_naming_the_flag_typed(tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()  # `runs/typo` then looks local: a missing folder, never a hub id
    argv, flag = _MODEL_COMMANDS[command]
    assert cli.main([*argv, "runs/typo"]) == 2
    _one_line_error(capsys, f"{flag} runs/typo: no such folder")


def test_bench_on_a_missing_local_model_names_model_as_typed(tmp_path, capsys, monkeypatch):
    """`bench --model runs/typo` said 'model.path: folder ... does not exist', a key the user never typed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert cli.main(["bench", "--steps", "1", "--model", "runs/typo"]) == 2
    _one_line_error(capsys, "--model runs/typo: no such folder")


@pytest.mark.parametrize("command", list(_MODEL_COMMANDS))
def test_a_hub_model_with_a_hub_that_never_answers_is_one_line_naming_the_flag(tmp_path, capsys, silent_hub,
                                                                             monkeypatch, command):
    import time

    from mlx_grpo.config.hub import TIMEOUT_S

    monkeypatch.chdir(tmp_path)
    argv, flag = _MODEL_COMMANDS[command]
    tic = time.monotonic()
    assert cli.main([*argv, "nobody/no-such-thing"]) == 2
    assert time.monotonic() - tic < 2 * TIMEOUT_S + 5
    _one_line_error(capsys, f"{flag}: cannot load 'nobody/no-such-thing' from the hub, which cannot be reached")


# --- model folders the loader refuses, read by the memory planner first ------------------------

def _damage(folder: Path, kind: str) -> None:
    import json
    import struct

    config, weights = folder / "config.json", folder / "model.safetensors"
    cfg = json.loads(config.read_text())
    blob = weights.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    if kind == "truncated header":
        weights.write_bytes(blob[:50])
    elif kind == "truncated weights":
        weights.write_bytes(blob[: len(blob) // 2])
    elif kind == "header not JSON":
        weights.write_bytes(blob[:8] + b"x" * n + blob[8 + n:])
    elif kind == "garbage config":
        config.write_text("{not json")
    elif kind == "config not an object":
        config.write_text("[1, 2]")
    elif kind in ("absurd size", "missing key", "wrong type"):
        if kind == "absurd size":
            cfg["hidden_size"] = 10**12
        elif kind == "missing key":
            del cfg["num_hidden_layers"]
        else:
            cfg["num_attention_heads"] = "four"
        config.write_text(json.dumps(cfg))
    elif kind == "absurd shape":
        name = next(k for k in header if k != "__metadata__")
        header[name]["shape"] = [10**9, 10**9]
        text = json.dumps(header).encode()
        weights.write_bytes(struct.pack("<Q", len(text)) + text + blob[8 + n:])


_DAMAGE = ["truncated header", "truncated weights", "header not JSON", "garbage config", "config not an object",
           "absurd size", "missing key", "wrong type", "absurd shape"]


@pytest.mark.parametrize("kind", _DAMAGE)
def test_plan_and_train_refuse_a_damaged_model_folder_with_the_loaders_one_line(tmp_path, tiny_path, capsys, kind):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_path, folder)
    _damage(folder, kind)
    model = f'model.path="{folder}"'
    assert cli.main(["plan", "--config", SMOKE, "--set", model]) == 2
    planned = _one_line_error(capsys, f"model.path: {folder}")
    assert _train(tmp_path, model) == 2  # the planner runs first
    assert _one_line_error(capsys) == planned
    run = f'output_dir="{tmp_path / "run"}"'
    assert cli.main(["train", "--config", SMOKE, "--ignore-memory", "--set", model, "--set", run]) == 2
    assert _one_line_error(capsys) == planned


def test_a_huge_prompt_row_is_skipped_before_the_template_or_the_tokenizer_sees_it(tiny):
    """A 50 MB row took 175 s and 11 GB of memory to tokenize only to be skipped (0.1 s now)."""
    from mlx_grpo.config import DataConfig
    from mlx_grpo.data.examples import build_examples

    tokenizer, seen = tiny[1], []

    class Watched:  # the tiny tokenizer, noting how many characters each call is given
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def apply_chat_template(self, messages, **kwargs):
            seen.append(sum(len(m["content"]) for m in messages))
            return tokenizer.apply_chat_template(messages, **kwargs)

        def encode(self, text, **kwargs):
            seen.append(len(text))
            return tokenizer.encode(text, **kwargs)

    huge = "What is 1 + 1? " * 10_000  # 150,000 characters; 512 tokens of tiny's stand for at most 6,656
    rows = [{"question": huge, "answer": "#### 2"}, {"question": "What is 2 + 2?", "answer": "#### 4"}]
    examples, skipped = build_examples(rows, Watched(), DataConfig())
    assert (skipped, [e.question for e in examples]) == (1, ["What is 2 + 2?"])
    assert seen and max(seen) < 1000
