"""The end of a run on the console: steps, wall time, the reward and each reward's first -> last
window, the best eval, the final checkpoint and the warnings count; after a clean Ctrl-C too."""

import os
import signal

from checks import unwrap
from mlx_grpo import cli
from mlx_grpo.commands import step as train_mod
from mlx_grpo.run.log import format_summary


def _rows(n):
    # reward = step / 10; correctness = 1 on even steps; eval at steps 5 and 10
    rows = [{"step": s, "reward": s / 10, "rewards/correctness/mean": float(s % 2 == 0)} for s in range(1, n + 1)]
    for r in rows:
        if r["step"] in (5, 10):
            r["eval/reward"] = {5: 0.7, 10: 0.6}[r["step"]]
    return rows


def test_windows_are_the_first_and_last_ten_logged_steps():
    lines = format_summary(_rows(30), 125.4, 30, "runs/x/checkpoints/step_000030", warnings=2)
    # first 10 rewards 0.1..1.0 -> mean 0.55; last 10, 2.1..3.0 -> 2.55; correctness 5/10 both
    assert lines == [
        "mlx-grpo: done after step 30 of 30, 2m05s wall time, 2 warnings",
        "mlx-grpo: reward 0.550 -> 2.550 (mean of the first 10 logged steps -> the last 10)",
        "mlx-grpo:   correctness 0.500 -> 0.500",
        "mlx-grpo: best eval/reward 0.700 at step 5",
        "mlx-grpo: final checkpoint runs/x/checkpoints/step_000030",
    ]
    assert all(len(line) < 100 for line in lines)


def test_a_short_run_compares_halves():
    lines = format_summary(_rows(3), 3.0, 5, None, warnings=1, stopped=True)
    # w = 3 // 2 = 1: step 1 (0.1) against step 3 (0.3)
    assert lines[0] == "mlx-grpo: stopped after step 3 of 5, 0m03s wall time, 1 warning"
    assert lines[1] == "mlx-grpo: reward 0.100 -> 0.300 (mean of the first 1 logged steps -> the last 1)"
    assert lines[-1] == "mlx-grpo: no checkpoint written"


FAST = ["training.max_steps=3", "training.prompts_per_step=2", "generation.max_new_tokens=16",
        "checkpoint.save_every=10"]


def _sets(out):
    return [x for item in [*FAST, f'output_dir="{out}"'] for x in ("--set", item)]


def test_a_reward_that_scored_nothing_is_named_not_a_traceback():
    """A reward that gave None for every completion of every step (a judge that never answered
    with a score, a reward for a task the data lacks) logs rewards/NAME/mean = None; the summary
    crashed on it (TypeError) after the final checkpoint."""
    rows = [{"step": s, "reward": 0.5, "rewards/correctness/mean": 0.5, "rewards/judge/mean": None,
             "rewards/judge/none_frac": 1.0} for s in (1, 2)]
    lines = format_summary(rows, 2.0, 2, None, warnings=0)
    assert lines[2:4] == ["mlx-grpo:   correctness 0.500 -> 0.500",
                          "mlx-grpo:   judge scored no completion (None for every one)"]


def test_a_run_ends_with_the_summary(tmp_path, capsys):
    assert cli.main(["train", "--config", "configs/smoke_test.toml", *_sets(tmp_path / "run")]) == 0
    out = unwrap(capsys.readouterr().out)
    start = next(i for i, line in enumerate(out) if line.startswith("mlx-grpo: done after step 3 of 3"))
    assert out[start + 1].startswith("mlx-grpo: reward ")
    assert out[-1] == f"mlx-grpo: final checkpoint {tmp_path / 'run' / 'checkpoints' / 'step_000003'}"


def test_a_clean_stop_prints_the_summary(tmp_path, capsys, monkeypatch):
    real, calls = train_mod.sample_and_score, []

    def sample_and_score(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(train_mod, "sample_and_score", sample_and_score)
    assert cli.main(["train", "--config", "configs/smoke_test.toml", *_sets(tmp_path / "run")]) == 130
    out = "\n".join(unwrap(capsys.readouterr().out))
    assert "mlx-grpo: stopped after step 2 of 3" in out
    assert f"mlx-grpo: final checkpoint {tmp_path / 'run' / 'checkpoints' / 'step_000002'}" in out
