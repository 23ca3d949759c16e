"""Config: defaults, profile and --set layering, one-line errors naming the source, round-trip."""

import dataclasses
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from mlx_grpo.config import (
    Config,
    ConfigError,
    RewardConfig,
    config_to_dict,
    load_config,
    save_config,
)
from mlx_grpo.data.chat import DEFAULT_SYSTEM_PROMPT

PROFILES = sorted((Path(__file__).parent.parent / "configs").glob("*.toml"))


def write(tmp_path, text, name="profile.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def error(path=None, overrides=()):
    """The one-line message of the ConfigError that loading raises."""
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_imports_no_mlx():
    code = "import sys, mlx_grpo.config; print([m for m in sys.modules if m.split('.')[0] == 'mlx'])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_every_profile_validates_and_lists_only_changes(path):
    cfg = load_config(path)
    assert path.read_text().startswith("#")  # opens with its comment block
    defaults = config_to_dict(load_config(None))
    for section, table in tomllib.loads(path.read_text()).items():
        if not isinstance(table, dict):
            assert table != defaults[section], f"{path.name}: {section} repeats the default"
            continue
        for key, value in table.items():
            assert value != defaults[section][key], f"{path.name}: {section}.{key} is the default"
    assert cfg.output_dir == f"runs/{path.stem}"  # runs of different profiles never mix


def test_profiles_exist():
    assert {p.stem for p in PROFILES} >= {"smoke_test", "default", "production"}


def test_defaults():
    cfg = load_config(None)
    assert cfg == load_config(None, [])
    assert (cfg.seed, cfg.output_dir) == (0, "runs/default")
    assert cfg.model.path == "builtin:tiny" and cfg.model.dtype == "auto"
    assert cfg.lora.enabled is False and cfg.lora.scale == 16.0 / 8
    assert cfg.lora.target_modules == ["all-linear"]
    assert cfg.data.dataset == "builtin:arithmetic"
    assert cfg.data.system_prompt == DEFAULT_SYSTEM_PROMPT
    assert cfg.generation.num_generations == 8 and cfg.generation.top_p == 1.0
    assert cfg.grpo.loss_type == "dapo" and cfg.grpo.beta == 0.0  # TRL 1.16's GRPOConfig
    assert cfg.generation.max_new_tokens == 512 and cfg.training.lr_schedule == "linear"
    assert cfg.rewards == [RewardConfig("gsm8k_correctness", 1.0), RewardConfig("xml_format", 0.5)]
    assert cfg.training.adam_betas == [0.9, 0.999] and cfg.training.learning_rate == 1e-6
    assert (cfg.checkpoint.save_every, cfg.checkpoint.keep_last) == (50, 3)


def test_defaults_are_not_shared_between_configs():
    a, b = load_config(None), load_config(None)
    a.training.adam_betas.append(0.5)
    a.rewards.clear()
    assert b.training.adam_betas == [0.9, 0.999] and len(b.rewards) == 2
    assert Config().lora.target_modules is not Config().lora.target_modules


def test_profile_overrides_defaults_and_set_beats_profile(tmp_path):
    path = write(tmp_path, "seed = 7\n[training]\nmax_steps = 20\nlearning_rate = 3e-5\n")
    cfg = load_config(path)
    assert (cfg.seed, cfg.training.max_steps, cfg.training.learning_rate) == (7, 20, 3e-5)
    assert cfg.training.prompts_per_step == 2  # untouched keys keep their defaults
    cfg = load_config(path, ["training.max_steps=5", "seed=3", 'output_dir="runs/x"'])
    assert (cfg.seed, cfg.training.max_steps, cfg.output_dir) == (3, 5, "runs/x")
    assert cfg.training.learning_rate == 3e-5
    twice = load_config(path, ["training.max_steps=5", "training.max_steps=6"])
    assert twice.training.max_steps == 6  # the last --set wins


def test_override_values_use_toml_syntax():
    cfg = load_config(None, [
        'grpo.loss_type="dr_grpo"', "training.adam_betas=[0.9, 0.95]", "lora.enabled=true",
        " generation.temperature = 0.7 ", "lora.alpha=32",
    ])
    assert cfg.grpo.loss_type == "dr_grpo" and cfg.training.adam_betas == [0.9, 0.95]
    assert cfg.lora.enabled is True and cfg.generation.temperature == 0.7
    assert cfg.lora.alpha == 32.0 and type(cfg.lora.alpha) is float  # int -> float is fine


def test_bare_string_convenience():
    cfg = load_config(None, ["grpo.loss_type=dr_grpo", "data.dataset=openai/gsm8k", "data.subset="])
    assert cfg.grpo.loss_type == "dr_grpo" and cfg.data.dataset == "openai/gsm8k"
    assert cfg.data.subset == ""
    assert "not valid TOML" in error(None, ['data.dataset="open'])  # quotes: no fallback
    assert "not valid TOML" in error(None, ["training.adam_betas=[0.9"])


def test_override_rewards():
    cfg = load_config(None, ['rewards=[{name="xml_format",weight=1.0}]'])
    assert cfg.rewards == [RewardConfig("xml_format", 1.0)]
    cfg = load_config(None, ['rewards=[{name="a"}, {name="b", weight=0}]'])
    assert cfg.rewards == [RewardConfig("a", 1.0), RewardConfig("b", 0.0)]


def test_profile_rewards_replace_the_default_list(tmp_path):
    path = write(tmp_path, '[[rewards]]\nname = "xml_format"\nweight = 2\n')
    assert load_config(path).rewards == [RewardConfig("xml_format", 2.0)]
    assert "rewards[0].name is required" in error(write(tmp_path, "[[rewards]]\nweight = 1\n"))
    assert "at least one reward" in error(None, ["rewards=[]"])
    assert "rewards must be an array" in error(write(tmp_path, "[rewards]\nname = 'x'\n"))
    msg = error(None, ['rewards=[{name="a", wieght=1}]'])
    assert "unknown key 'rewards[0].wieght' (did you mean 'rewards[0].weight'?)" in msg


def test_unknown_section(tmp_path):
    path = write(tmp_path, "[traning]\nmax_steps = 3\n")
    assert error(path) == f"{path}: unknown section 'traning' (did you mean 'training'?)"


def test_unknown_key_with_suggestion(tmp_path):
    path = write(tmp_path, "[training]\nmax_step = 3\n")
    expected = "unknown key 'training.max_step' (did you mean 'training.max_steps'?)"
    assert error(path) == f"{path}: {expected}"
    assert "unknown key 'sead' (did you mean 'seed'?)" in error(write(tmp_path, "sead = 1\n"))
    assert "known: " in error(None, ["logging.zzz=1"])  # nothing close: list the known keys


def test_typo_in_nested_key(tmp_path):
    path = write(tmp_path, "[training.adam]\nbetas = [0.9, 0.9]\n")
    assert "unknown key 'training.adam'" in error(path)
    msg = error(None, ["training.max_steps.x=1"])
    assert "training.max_steps must be an integer, got table" in msg
    assert "unknown key 'grpo.loss_typ'" in error(None, ["grpo.loss_typ=dapo"])
    assert "model must be a table, got integer 3" in error(None, ["model=3"])


@pytest.mark.parametrize("override, expected", [
    ("training.max_steps=abc", "training.max_steps must be an integer, got string 'abc'"),
    ("training.max_steps=2.0", "training.max_steps must be an integer, got float 2.0"),
    ("training.max_steps=true", "training.max_steps must be an integer, got boolean True"),
    ("training.learning_rate=false", "training.learning_rate must be a number, got boolean False"),
    ("lora.enabled=1", "lora.enabled must be a boolean, got integer 1"),
    ('training.adam_betas=[0.9, "x"]', "training.adam_betas[1] must be a number, got string 'x'"),
    ("lora.target_modules=[1]", "lora.target_modules[0] must be a string, got integer 1"),
    ("training.adam_betas=0.9", "training.adam_betas must be an array, got float 0.9"),
    ("lora.alpha=nan", "lora.alpha must be a finite number, got float nan"),
])
def test_wrong_type(override, expected):
    assert error(None, [override]) == f"--set {override}: {expected}"


def test_wrong_type_in_file_names_the_file(tmp_path):
    path = write(tmp_path, '[generation]\nmax_new_tokens = "64"\n')
    assert error(path) == f"{path}: generation.max_new_tokens must be an integer, got string '64'"


@pytest.mark.parametrize("override, expected", [
    ("generation.num_generations=1", "at least 2 because advantages are relative within a group"),
    ("generation.top_p=0", "generation.top_p must be in (0, 1], got 0.0"),
    ("training.learning_rate=-1e-5", "training.learning_rate must be > 0, got -1e-05"),
    ("lora.rank=0", "lora.rank must be in [1, 4096], got 0"),
    ("lora.num_layers=0", "lora.num_layers must be -1 (all layers) or >= 1, got 0"),
    ("lora.dropout=1", "lora.dropout must be in [0, 1), got 1.0"),
    ("training.adam_betas=[0.9]", "training.adam_betas must be two values, each in [0, 1)"),
    ("training.adam_betas=[0.9, 1.0]", "training.adam_betas must be two values, each in [0, 1)"),
    ("grpo.epsilon_high=0", "grpo.epsilon_high must be > 0, got 0.0"),
    ("model.quantize_bits=3", "model.quantize_bits must be one of 0, 4, 8, got 3"),
    ("model.dtype=fp16", "model.dtype must be one of 'auto', 'float32', 'float16', 'bfloat16', got 'fp16'"),
    ("generation.quantize_bits=2", "generation.quantize_bits must be one of 0, 4, 8, got 2"),
    ("grpo.importance_sampling_correction=token_mask",
     "grpo.importance_sampling_correction must be one of 'auto', 'none', 'token_truncate', 'sequence_mask'"),
    ("grpo.importance_sampling_cap=0", "grpo.importance_sampling_cap must be > 0, got 0.0"),
    ("grpo.importance_sampling_floor=-1", "grpo.importance_sampling_floor must be >= 0, got -1.0"),
])
def test_out_of_range(override, expected):
    assert expected in error(None, [override])


def test_importance_sampling_band_and_quantized_rollouts_of_a_quantized_policy():
    assert error(None, ["grpo.importance_sampling_floor=3"]) == (
        "grpo.importance_sampling_floor must be < grpo.importance_sampling_cap (3.0), got 3.0")
    assert "QLoRA" in error(None, ["model.quantize_bits=4", "lora.enabled=true", "generation.quantize_bits=8"])


def test_zero_means_off_where_documented():
    cfg = load_config(None, ["training.max_grad_norm=0", "generation.top_k=0", "grpo.beta=0",
                             "generation.batch_size=0", "training.micro_batch_size=0"])
    assert cfg.training.max_grad_norm == 0.0 and cfg.grpo.beta == 0.0


def test_bad_enum_lists_allowed_values():
    msg = error(None, ["grpo.loss_type=ppo"])
    assert msg == ("--set grpo.loss_type=ppo: grpo.loss_type must be one of "
                   "'grpo', 'bnpo', 'dr_grpo', 'dapo', got 'ppo'")
    assert "'group', 'batch', 'none'" in error(None, ["grpo.scale_rewards=token"])


def test_missing_profile_file(tmp_path):
    path = tmp_path / "nope.toml"
    assert error(path) == f"{path}: profile file not found"
    assert "cannot read profile file" in error(tmp_path)  # a folder


def test_broken_toml_names_file_and_line(tmp_path):
    path = write(tmp_path, "[training]\nmax_steps = 3\nlearning_rate = \n")
    msg = error(path)
    assert msg.startswith(f"{path}: invalid TOML") and "line 3" in msg


@pytest.mark.parametrize("override", ["training.max_steps", "=3", "training..max_steps=3", ""])
def test_bad_override_syntax(override):
    expected = "expected section.key=value, e.g. training.max_steps=20"
    assert error(None, [override]) == f"--set {override}: {expected}"


def test_unknown_key_in_override_names_set():
    msg = error(None, ["training.max_step=3"])
    assert msg == ("--set training.max_step=3: unknown key 'training.max_step' "
                   "(did you mean 'training.max_steps'?)")
    assert "more than one TOML value" in error(None, ["seed=1\nx = 2"])


def test_epsilon_high_resolution(tmp_path):
    assert load_config(None).grpo.epsilon_high == 0.2
    assert load_config(None, ["grpo.epsilon=0.3"]).grpo.epsilon_high == 0.3
    cfg = load_config(write(tmp_path, "[grpo]\nepsilon = 0.3\nepsilon_high = 0.28\n"))
    assert (cfg.grpo.epsilon, cfg.grpo.epsilon_high) == (0.3, 0.28)
    assert type(load_config(None, ["grpo.epsilon_high=1"]).grpo.epsilon_high) is float
    assert "epsilon_high" not in config_to_dict(Config())["grpo"]  # unresolved None is left out


@pytest.mark.parametrize("path", [None, *PROFILES], ids=lambda p: p.name if p else "defaults")
def test_save_load_round_trip(tmp_path, path):
    cfg = load_config(path, ["training.adam_betas=[0.8, 0.9]", 'rewards=[{name="a", weight=0.25}]'])
    out = tmp_path / "run" / "config.toml"
    save_config(cfg, out)
    assert load_config(out) == cfg
    # every key is written, but a judge's keys, unset (None) on any other reward
    assert tomllib.loads(out.read_text()) == config_to_dict(cfg) == {
        **dataclasses.asdict(cfg), "rewards": [{"name": "a", "weight": 0.25}]}
