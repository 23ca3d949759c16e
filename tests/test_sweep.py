"""`mlx-grpo sweep`: variants (ablation or grid), checked before training, run and tabulated."""

import json
import sys
import tomllib

import pytest

import mlx_grpo.commands.sweep
from mlx_grpo.cli import main
from mlx_grpo.config import ConfigError
from mlx_grpo.run.log import read_metrics
from mlx_grpo.commands.sweep import folder_name, make_variants, plan, results_table, split_values

SMOKE = "configs/smoke_test.toml"


def test_values_split_at_top_level_commas_only():
    assert split_values("0, 0.04,0.1") == ["0", "0.04", "0.1"]
    assert split_values('[1, 2],[3]') == ["[1, 2]", "[3]"]
    assert split_values('"a,b",c') == ['"a,b"', "c"]


def test_ablation_changes_one_key_at_a_time_and_grid_takes_the_product():
    vary = ["grpo.beta=0,0.04", "training.learning_rate=1e-5,1e-4,1e-3"]
    assert [v.overrides for v in make_variants(vary)] == [
        ["grpo.beta=0"], ["grpo.beta=0.04"],
        ["training.learning_rate=1e-5"], ["training.learning_rate=1e-4"], ["training.learning_rate=1e-3"],
    ]
    grid = make_variants(vary, grid=True)
    assert len(grid) == 6 and grid[1].name == "grpo.beta=0,training.learning_rate=1e-4"
    assert folder_name('grpo.loss_type="dr_grpo"') == "grpo.loss_type=_dr_grpo_"


def test_every_variant_is_checked_before_any_run(tmp_path):
    root, planned = plan(SMOKE, ["grpo.beta=0,0.1", "grpo.loss_type=grpo,dapo"], steps=7,
                         overrides=[f'output_dir="{tmp_path}"'])
    assert root == tmp_path / "sweep"
    assert [(c.grpo.beta, c.grpo.loss_type, c.training.max_steps) for _, c in planned] == [
        (0.0, "dapo", 7), (0.1, "dapo", 7), (0.0, "grpo", 7), (0.0, "dapo", 7)]
    assert planned[3][1].output_dir == str(tmp_path / "sweep" / "grpo.loss_type=dapo")
    with pytest.raises(ConfigError, match="--set grpo.beta=-1: grpo.beta must be >= 0"):
        plan(SMOKE, ["grpo.beta=0,-1"])
    with pytest.raises(ConfigError, match="unknown key 'grpo.bta'"):
        plan(SMOKE, ["grpo.bta=0,1"])
    with pytest.raises(ConfigError, match="--vary grpo.beta: expected section.key=value1,value2"):
        make_variants(["grpo.beta"])
    with pytest.raises(ConfigError, match="names a key twice"):
        make_variants(["grpo.beta=0", "grpo.beta=1"])
    with pytest.raises(ConfigError, match="listed twice"):
        make_variants(["grpo.beta=0,0"])


def test_table_shows_eval_only_when_logged():
    row = {"name": "grpo.beta=0", "final_reward": 0.5, "best_reward": 0.75, "best_step": 3, "eval": {},
           "kl": None, "wall_time_s": 12.34, "peak_memory_gb": 0.051}
    lines = results_table([row]).splitlines()
    assert lines[0] == "run          final reward  best reward (step)  kl  wall time (s)  peak mem (GB)"
    assert lines[2].split() == ["grpo.beta=0", "0.500", "0.750", "(3)", "-", "12.3", "0.05"]
    lines = results_table([dict(row, eval={"eval/reward": 0.6, "eval/rewards/x/mean": 1.0})]).splitlines()
    assert "eval/reward" in lines[0] and "eval/rewards/x/mean" not in lines[0] and "0.600" in lines[2]


@pytest.mark.extra
def test_sweep_of_two_values_runs_and_tabulates(tmp_path, capsys):
    pytest.importorskip("matplotlib")  # CI installs the plot extra (.ci/run)
    code = main(["sweep", "--config", SMOKE, "--vary", "grpo.beta=0,0.04", "--steps", "2",
                 "--set", f'output_dir="{tmp_path}"', "--set", "training.prompts_per_step=2",
                 "--set", "generation.max_new_tokens=32"])
    assert code == 0
    out = capsys.readouterr().out
    root = tmp_path / "sweep"
    for beta in ("0", "0.04"):
        run = root / f"grpo.beta={beta}"
        cfg = tomllib.loads((run / "config.toml").read_text())
        assert cfg["grpo"]["beta"] == float(beta) and cfg["training"]["max_steps"] == 2
        assert [r["step"] for r in read_metrics(run)] == [1, 2]
    table = out[out.index("run    "):].splitlines()
    assert table[0].split("  ")[0].strip() == "run"
    assert [line.split()[0] for line in table[2:4]] == ["grpo.beta=0", "grpo.beta=0.04"]
    kl = read_metrics(root / "grpo.beta=0.04")[-1]["kl"]
    assert table[2].split()[4] == "-" and table[3].split()[4] == f"{kl:.4g}"  # no KL without a reference
    final = read_metrics(root / "grpo.beta=0")[-1]["reward"]
    assert table[2].split()[1] == f"{final:.3f}"
    assert (root / "report.html").stat().st_size > 10_000
    assert f"wrote {root / 'report.html'}" in out


def test_sweep_without_matplotlib_still_tabulates(tmp_path, capsys, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.25}) + "\n")
    row = {"name": "grpo.beta=0", "dir": str(tmp_path), "final_reward": 0.25, "best_reward": 0.25, "best_step": 1,
           "eval": {}, "kl": None, "wall_time_s": 1.0, "peak_memory_gb": None}
    monkeypatch.setattr(mlx_grpo.commands.sweep, "run_sweep", lambda *a, **k: [row])
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["sweep", "--config", SMOKE, "--vary", "grpo.beta=0"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1].split() == ["grpo.beta=0", "0.250", "0.250", "(1)", "-", "1.0", "-"]
    assert captured.err.startswith("mlx-grpo sweep: no report: plotting needs matplotlib")
