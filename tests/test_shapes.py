"""`shape:NAME` (models/shapes.py): the catalog's facts, the tokenizer made here, the folder built
once, the planner planning a shape before it is built (and refusing one too large), the
`data.chat_template_kwargs` setting, and bad names."""

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import load_tokenizer

from checks import one_line_error
from mlx_grpo import cli
from mlx_grpo.commands.plan import shares_prefix
from mlx_grpo.commands.setup import build_policy
from mlx_grpo.config import load_config, save_config
from mlx_grpo.data.examples import load_examples
from mlx_grpo.models.saved_template import write_system_prompt
from mlx_grpo.models.shapes import build_shape, shape_config, write_tokenizer_and_config
from mlx_grpo.models.shapes_catalog import SHAPES
from mlx_grpo.planner.shapes import config_model_shape, read_model_shape, run_shape, trainable_params

SMOKE = "configs/smoke_test.toml"
FAMILIES = sorted(SHAPES)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MLX_GRPO_CACHE", str(folder))
    return folder


def test_an_unknown_shape_is_one_line_listing_the_known_ones(tmp_path, cache, capsys):
    model = 'model.path="shape:nope"'
    assert cli.main(["plan", "--config", SMOKE, "--set", model]) == 2
    line = one_line_error(capsys, "model.path: unknown model shape shape:nope; known: ")
    assert all(f"shape:{name}" in line for name in SHAPES)
    assert cli.main(["train", "--config", SMOKE, "--set", model, "--set", f'output_dir="{tmp_path / "run"}"']) == 2
    one_line_error(capsys, "model.path: unknown model shape shape:nope")
    assert cli.main(["generate", "--model", "shape:nope", "--prompt", "hi"]) == 2
    one_line_error(capsys, "--model: unknown model shape shape:nope; known: shape:")
    assert not cache.exists()


def test_a_shape_too_large_for_the_machine_is_refused_before_any_weight_is_made(tmp_path, cache, capsys):
    # smollm2-360m in float32 (the CPU backend's "auto"): 362M parameters x 4 bytes > 1 GB
    assert cli.main(["plan", "--config", SMOKE, "--memory-gb", "1", "--set", 'model.path="shape:smollm2-360m"']) == 1
    out = capsys.readouterr().out
    assert "does not fit" in out and "peak on this data" in out  # its tokenizer, written aside, measured the data
    run = f'output_dir="{tmp_path / "run"}"'
    assert cli.main(["train", "--config", SMOKE, "--memory-gb", "2", "--set", 'model.path="shape:qwen2.5-1.5b"',
                     "--set", run]) == 2
    one_line_error(capsys, "predicted peak memory", "> 2.00 GB on this device")
    assert not cache.exists() and not (tmp_path / "run").exists()


# Parameters of the published checkpoints (tied embeddings counted once), as their model cards
# and safetensors give them: a wrong size, layer count or tie in a config changes the count.
PUBLISHED_PARAMETERS = {"qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "llama-3.2-1b": 1_235_814_400,
                        "gemma-3-1b": 999_885_952, "smollm2-360m": 361_821_120, "lfm2-350m": 354_483_968}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_each_config_has_the_published_parameter_count(name):
    shape = config_model_shape(shape_config(name))
    assert sum(t.size for t in shape.tensors.values()) == PUBLISHED_PARAMETERS[name]


def test_planning_a_model_from_its_config_draws_no_random_number(tmp_path):
    """`plan` runs mid-run (training.worst_case_first = "auto"): building mlx-lm's class for a
    config drew from MLX's stream (its layers' initialisers), and the run sampled other completions."""
    mx.random.seed(3)
    expected = mx.random.uniform().item()
    mx.random.seed(3)
    config_model_shape(shape_config("qwen2.5-0.5b"))
    shares_prefix(shape_config("lfm2-350m"))
    assert mx.random.uniform().item() == expected


@pytest.mark.parametrize("name", FAMILIES)
def test_the_planner_sees_before_the_build_the_tensors_the_build_writes(tmp_path, name):
    """A shape not built yet is planned from its config (mlx-lm's class, built lazily): the
    same tensors as the safetensors headers of the folder once built, Gemma's dropped head too."""
    folder = build_shape(tmp_path, name, shrunk=True)
    assert config_model_shape(shape_config(name, shrunk=True)) == read_model_shape(folder)


@pytest.mark.parametrize("name", FAMILIES)
def test_lora_all_linear_adapts_every_linear_layer_and_the_planner_counts_it(tmp_path, name):
    """The default lora.target_modules, "all-linear", fits every family: a hybrid's convolution
    and delta-net projections are adapted as its attention and MLP are, and the planner's count
    of trainable parameters is the model's, with LoRA and without."""
    folder = build_shape(tmp_path, name, shrunk=True)
    for lora in ("true", "false"):
        cfg = load_config(None, [f'model.path="{folder}"', f"lora.enabled={lora}", "lora.rank=4"])
        model = build_policy(cfg)[0]
        real = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
        assert trainable_params(read_model_shape(folder), run_shape(cfg)) == real
    bare = [n for layer in model.layers for n, m in layer.named_modules()
            if type(m) is nn.Linear and not n.endswith(".linear")]  # a LoRA layer's base is `<name>.linear`
    assert lora == "false" and len(bare) > 0
    model = build_policy(load_config(None, [f'model.path="{folder}"', "lora.enabled=true", "lora.rank=4"]))[0]
    assert not [n for layer in model.layers for n, m in layer.named_modules()
                if type(m) is nn.Linear and not n.endswith(".linear")]


def test_the_tokenizer_has_exactly_the_vocabulary_and_the_published_special_ids(tmp_path):
    """SmolLM2's real 49152-token vocabulary (the others are checked at their real sizes by
    tests/test_real_shapes.py, slow: a 262k vocabulary takes seconds to build and load)."""
    write_tokenizer_and_config(tmp_path, "smollm2-360m")
    tokenizer = load_tokenizer(tmp_path)
    assert len(tokenizer) == 49152 == json.loads((tmp_path / "config.json").read_text())["vocab_size"]
    ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
                                                         add_generation_prompt=True, tokenize=False))
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1 and tokenizer.eos_token_ids == {2}
    assert tokenizer.decode(list(range(49152))[300:310])  # every id is text


@pytest.mark.parametrize("name", FAMILIES)
def test_a_shrunk_copy_keeps_its_family_specials_within_its_vocabulary(tmp_path, name):
    folder = build_shape(tmp_path, name, shrunk=True)
    tokenizer = load_tokenizer(folder)
    config = json.loads((folder / "config.json").read_text())
    assert len(tokenizer) == 512
    eos = config.get("eos_token_id", config.get("text_config", {}).get("eos_token_id"))
    for i in eos if isinstance(eos, list) else [eos]:
        assert tokenizer.convert_ids_to_tokens(i) in SHAPES[name].specials.values()
    assert tokenizer.convert_tokens_to_ids(SHAPES[name].eos) in tokenizer.eos_token_ids


def test_two_processes_building_one_shape_at_once_both_get_the_whole_folder(tmp_path, cache):
    child = (
        "import dataclasses, sys, time\n"
        "import mlx_grpo.models.shapes as shapes\n"
        "from mlx_grpo.models.shapes_catalog import SHAPES\n"
        "SHAPES['lfm2-350m'] = dataclasses.replace(SHAPES['lfm2-350m'], "
        "config=shapes.shape_config('lfm2-350m', shrunk=True))\n"
        "build = shapes.build_shape\n"
        "shapes.build_shape = lambda *a: (build(*a), time.sleep(2))[0]  # both are building at once\n"
        "print(shapes.shape_model_path('lfm2-350m'))\n"
    )
    env = {**os.environ, "MLX_GRPO_CACHE": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", child], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    paths = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(paths) == 1
    (folder,) = map(Path, paths)
    assert sorted(p.name for p in cache.iterdir()) == [folder.name]  # no half-built folder left
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in folder.iterdir()}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return build_shape(tmp_path_factory.mktemp("qwen3"), "qwen3-0.6b", shrunk=True)


def test_chat_template_kwargs_are_type_checked_and_saved(tmp_path):
    cfg = load_config(None, ["data.chat_template_kwargs={enable_thinking=false}"])
    assert cfg.data.chat_template_kwargs == {"enable_thinking": False}
    assert load_config(None).data.chat_template_kwargs == {}
    save_config(cfg, tmp_path / "config.toml")
    assert load_config(tmp_path / "config.toml") == cfg


def test_enable_thinking_false_closes_an_empty_think_block_in_every_training_prompt(qwen3):
    tokenizer = load_tokenizer(qwen3)
    think, end = tokenizer.convert_tokens_to_ids("<think>"), tokenizer.convert_tokens_to_ids("</think>")
    for kwargs, ending in (("{}", "<|im_start|>assistant\n"),
                           ("{enable_thinking=false}", "<|im_start|>assistant\n<think>\n\n</think>\n\n")):
        cfg = load_config(None, [f"data.chat_template_kwargs={kwargs}"])
        examples = load_examples(cfg.data, tokenizer)
        assert all(e.prompt.endswith(ending) for e in examples)
        assert all((think in e.prompt_tokens and end in e.prompt_tokens) == (kwargs != "{}") for e in examples)


def test_a_saved_template_keeps_the_runs_chat_template_kwargs(tmp_path, qwen3):
    """mlx-lm passes enable_thinking (true where the vocabulary has <think>) on every call: the
    saved template sets the run's value, so mlx_lm.generate asks the model as training did."""
    import shutil

    folder = tmp_path / "saved"
    shutil.copytree(qwen3, folder)
    write_system_prompt(folder, "Be brief.", {"enable_thinking": False})
    tokenizer = load_tokenizer(folder)
    messages = [{"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.") and text.endswith("<think>\n\n</think>\n\n")
    assert load_tokenizer(qwen3).apply_chat_template(messages, add_generation_prompt=True, tokenize=False).endswith(
        "<|im_start|>assistant\n")  # the folder as built: thinking on, as mlx-lm asks by default
