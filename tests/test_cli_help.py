"""The command line's own manners: --version, a help text for every option, and a bare key in
--set pointed at its section."""

import argparse
import re

import pytest

import mlx_grpo
from mlx_grpo.cli import build_parser, main
from mlx_grpo.config import ConfigError, load_config


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"mlx-grpo {mlx_grpo.__version__}\n"


def test_every_option_of_every_command_has_help():
    parser, _ = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {action.option_strings or action.dest}" for name, sub in subs.choices.items()
               for action in sub._actions if not action.help and action.dest != "help"]
    assert not missing


def test_every_command_s_help_names_its_docs_page(capsys):
    """`mlx-grpo --help` and each command's --help end by naming a page of docs/ that exists."""
    from pathlib import Path

    from mlx_grpo.cli import COMMANDS

    root = Path(__file__).resolve().parent.parent
    for argv in [[], *([name] for name in COMMANDS)]:
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        pages = re.findall(r"docs/[\w-]+\.md", capsys.readouterr().out)
        assert pages and all((root / p).exists() for p in pages), (argv, pages)


@pytest.mark.parametrize(("item", "hint"), [
    ("max_steps=3", "did you mean 'training.max_steps'?"),
    ("beta=0.1", "did you mean 'grpo.beta'?"),
    ("batch_size=4", "did you mean 'generation.batch_size' or 'eval.batch_size'?"),
])
def test_a_bare_key_is_refused_with_its_section(item, hint):
    with pytest.raises(ConfigError) as e:
        load_config(None, [item])
    assert str(e.value) == f"--set {item}: unknown key '{item.split('=')[0]}' ({hint})"


def test_a_bare_key_from_the_command_line(capsys):
    assert main(["--config", "configs/smoke_test.toml", "--set", "max_steps=3"]) == 2
    assert capsys.readouterr().err == ("mlx-grpo: error: --set max_steps=3: unknown key 'max_steps' "
                                       "(did you mean 'training.max_steps'?)\n")


def test_help_and_config_load_no_model_library():
    """Only the command run is imported: `--help`, `config` and `launch`'s parent start in a
    fraction of a second instead of the ~4 s MLX and mlx-lm take to load."""
    import subprocess
    import sys

    code = ("import sys; from mlx_grpo.cli import main\n"
            "for argv in (['--help'], ['config', '--help'], ['launch', '--help']):\n"
            "    try: main(argv)\n"
            "    except SystemExit: pass\n"
            "print(sorted(m for m in ('mlx_lm', 'transformers', 'datasets') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-300:]
