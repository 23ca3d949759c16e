"""docs/configuration.md is generated from mlx_grpo/config/ and `mlx-grpo config --show` prints a
profile that loads back as the same config."""

from pathlib import Path
import tomllib

from mlx_grpo.cli import main
from mlx_grpo.config import config_to_dict, load_config
from mlx_grpo.config.describe import DESCRIPTIONS, config_keys, reference_markdown

ROOT = Path(__file__).resolve().parent.parent


def test_every_key_has_one_sentence_and_every_sentence_a_key():
    keys = [key for key, _, _ in config_keys()]
    assert len(keys) == len(set(keys)) > 80
    assert set(keys) == set(DESCRIPTIONS), set(keys) ^ set(DESCRIPTIONS)


def test_the_reference_page_is_the_generated_one():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == reference_markdown(), "run: uv run mlx-grpo config --reference > docs/configuration.md"
    assert "| `max_steps` | integer | `100` | >= 1 |" in page  # a default as the dataclass holds it


def test_show_prints_the_resolved_profile_which_loads_back_equal(tmp_path, capsys):
    assert main(["config", "--show", "--config", "configs/smoke_test.toml", "--set", "training.max_steps=3"]) == 0
    text = capsys.readouterr().out
    shown = tomllib.loads(text)
    assert shown["training"]["max_steps"] == 3 and shown["generation"]["num_generations"] == 4  # the profile's
    assert shown["grpo"]["loss_type"] == "dapo"  # a default the profile does not name
    (tmp_path / "p.toml").write_text(text)
    expected = load_config("configs/smoke_test.toml", ["training.max_steps=3"])
    assert config_to_dict(load_config(tmp_path / "p.toml")) == config_to_dict(expected)
