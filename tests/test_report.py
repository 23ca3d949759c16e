"""`mlx-grpo report`: PNG and HTML from a real tiny run; sample completions; clear errors."""

import contextlib
import io
import json
import sys

import pytest

from mlx_grpo.cli import main
from mlx_grpo.config import load_config
from mlx_grpo.run.log import read_jsonl, read_metrics
from mlx_grpo.commands.report import ReportError, panel_keys, run_summary, smooth, write_report
from mlx_grpo.commands.train import train

pytest.importorskip("matplotlib")  # CI installs the plot extra (.ci/run)
pytestmark = pytest.mark.extra

FAST = ["training.max_steps=3", "training.prompts_per_step=2", "generation.max_new_tokens=32",
        "generation.num_generations=4", "checkpoint.save_every=10", "training.learning_rate=1e-3",
        "logging.log_completions=5", "grpo.beta=0.04"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real three-step run of the tiny model and its console output; a KL bound of 1e-12
    makes the live warning fire."""
    out = tmp_path_factory.mktemp("report") / "run"
    cfg = load_config("configs/smoke_test.toml", FAST + [f'output_dir="{out}"', "logging.warn_kl=1e-12"])
    console = io.StringIO()
    with contextlib.redirect_stdout(console):  # tqdm.write prints to the sys.stdout of the moment
        train(cfg)
    return out, console.getvalue()


@pytest.fixture
def run_dir(trained):
    return trained[0]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_run_writes_sample_completions_with_each_reward(run_dir):
    rows = read_jsonl(run_dir / "completions.jsonl")
    assert [r["step"] for r in rows] == [1] * 5 + [2] * 5 + [3] * 5
    for r in rows:
        assert set(r["rewards"]) == {"gsm8k_correctness", "xml_format"}
        # the smoke profile weighs correctness 1.0 and format 0.5
        assert r["reward"] == pytest.approx(r["rewards"]["gsm8k_correctness"] + 0.5 * r["rewards"]["xml_format"])
        assert isinstance(r["completion"], str) and r["prompt"].startswith("What is")
    assert len({r["prompt"] for r in rows if r["step"] == 1}) == 2  # 5 samples span two groups of G = 4


def test_live_warning_is_printed_during_training(trained):
    run, out = trained
    kls = [r["kl"] for r in read_metrics(run)]
    assert kls[0] < 1e-12 < min(kls[1:])  # step 1 samples from the reference itself; then it moves
    assert out.count("mlx-grpo: warning at step 2: kl") == 1  # once, then counted
    assert "warnings this run: kl_high x2 (first at step 2)" in out


def test_png_has_a_panel_per_metric(run_dir, tmp_path):
    out = write_report([run_dir], tmp_path / "r.png")
    width, height = png_size(out.read_bytes())
    keys = [k for k, _ in panel_keys([{"rows": read_metrics(run_dir)}])]
    assert keys[:3] == ["reward", "rewards/gsm8k_correctness/mean", "rewards/xml_format/mean"]
    assert len(keys) == 14  # 3 reward panels + 11 others: 5 rows of 3
    assert "entropy" in keys and "clip_ratio/region_mean" in keys
    assert width > 1200 and height > 1500


def test_html_shows_summary_plot_and_samples(run_dir, tmp_path):
    out = write_report([run_dir, run_dir], tmp_path / "r.html")  # the same run twice: labels disambiguated
    page = out.read_text()
    assert page.count("<img alt='metrics' src='data:image/png;base64,") == 1
    assert page.count("<details>") == 6  # 3 steps of samples, for each of the two runs
    first = read_jsonl(run_dir / "completions.jsonl")[0]
    assert f"{first['rewards']['xml_format']:.3f}" in page
    assert "&lt;" in page or "<" not in first["completion"]  # completions are escaped
    s = run_summary(read_metrics(run_dir))
    assert s["steps"] == 3 and f"<td>{s['final_reward']:.3f}</td>" in page


def test_default_output_is_report_html_in_the_run(run_dir, capsys):
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "report.html").stat().st_size > 10_000
    assert f"wrote {run_dir / 'report.html'}" in capsys.readouterr().out


def test_eval_metrics_get_panels_and_summary(tmp_path):
    rows = [{"step": s, "reward": 0.1 * s, "kl": 0.01 * s, "step_time": 2.0, "peak_memory_gb": 0.5 + s / 10}
            for s in range(1, 6)]
    rows[1]["eval/reward"], rows[4]["eval/reward"] = 0.3, 0.45  # eval every few steps only
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [k for k, _ in panel_keys([{"rows": rows}])] == ["reward", "kl", "peak_memory_gb", "eval/reward"]
    s = run_summary(rows)
    assert s["eval"] == {"eval/reward": 0.45} and s["best_step"] == 5 and s["train_time_s"] == 10.0
    assert s["peak_memory_gb"] == pytest.approx(1.0)
    assert png_size(write_report([tmp_path], tmp_path / "e.png").read_bytes())[0] > 0


def test_smooth_is_a_debiased_moving_average():
    # span 3 -> alpha 0.5: 1; (0.5*1 + 0.5*3) / 0.75 = 2.333...; a constant stays constant
    assert smooth([1.0, 3.0], span=3) == pytest.approx([1.0, 0.5 * 1 * 0.5 / 0.75 + 1.5 / 0.75])
    assert smooth([2.0] * 40) == pytest.approx([2.0] * 40)


def test_bad_inputs_name_the_problem(tmp_path, run_dir, capsys, monkeypatch):
    with pytest.raises(ReportError, match="no metrics.jsonl here"):
        write_report([tmp_path / "nope"])
    with pytest.raises(ReportError, match=r"--out .*r\.pdf: expected a file name ending in \.png or \.html"):
        write_report([run_dir], tmp_path / "r.pdf")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the extra were not installed
    assert main(["report", str(run_dir), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("mlx-grpo: error: plotting needs matplotlib, an optional extra: run `uv sync --extra plot` "
                   "(or `uv run --extra plot mlx-grpo report ...`)")
    assert not (tmp_path / "x.png").exists()
