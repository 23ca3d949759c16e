"""Damaged inputs a run is started on (issue 19): data files, model folders, paths that do not
exist and hub ids with no hub. Each is one line naming the setting, never a traceback; each case
is a unit call or a train/eval that stops before its first step."""

import pytest

from mlx_grpo import cli

SMOKE = "configs/smoke_test.toml"


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("mlx-grpo: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


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
