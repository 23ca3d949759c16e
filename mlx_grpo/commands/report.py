"""`mlx-grpo report`: plots of one or more runs' metrics.jsonl, overlaid, as a PNG or an HTML
page that also shows each run's sample completions (completions.jsonl) with their rewards.

Each panel is one metric: the smoothed curve in the run's colour with the raw values faint
behind it. matplotlib is an optional extra (`uv run --extra plot ...`), imported only here
and only when a picture is drawn, with the Agg backend (no display needed).
"""

import base64
import html
import io
import math
import os
import sys
from pathlib import Path

from mlx_grpo.errors import UserError
from mlx_grpo.run.layout import COMPLETIONS, METRICS
from mlx_grpo.run.log import read_jsonl

# The panels, in order; a metric no run logged gets no panel. Reward functions and eval
# metrics are added after "reward" and at the end, one panel each, under their own names.
PANELS = [
    ("reward", "reward (weighted total)"),
    ("reward_std", "reward std"),
    ("frac_reward_zero_std", "frac_reward_zero_std (groups with no signal)"),
    ("kl", "KL to the reference"),
    ("entropy", "entropy of the policy (nats per token)"),
    ("completions/mean_length", "completion length (tokens)"),
    ("completions/clipped_ratio", "completions hitting max_new_tokens"),
    ("clip_ratio/region_mean", "tokens with the policy ratio clipped"),
    ("grad_norm", "grad norm (before clipping)"),
    ("learning_rate", "learning rate"),
    ("tokens_per_second", "tokens / s"),
    ("peak_memory_gb", "peak memory (GB)"),
]
FRACTIONS = {"frac_reward_zero_std", "completions/clipped_ratio", "clip_ratio/region_mean"}  # drawn on a fixed 0..1 axis
NONNEGATIVE = {"reward_std", "kl", "entropy", "completions/mean_length", "grad_norm", "learning_rate",
               "tokens_per_second", "peak_memory_gb"}  # axis from 0, so small wiggles look small
COLUMNS = 3
MAX_SAMPLE_STEPS = 50  # steps of sample completions shown per run on the HTML page


class ReportError(UserError, ValueError):
    """A run folder or output path the report cannot use; the message names it."""


def require_matplotlib():
    """pyplot with the Agg backend, or a one-line ReportError saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError(
            "plotting needs matplotlib, an optional extra: run `uv sync --extra plot` "
            "(or `uv run --extra plot mlx-grpo report ...`)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load_run(run_dir) -> dict:
    """A run folder's metrics rows and sample completions; errors name the folder."""
    run_dir = Path(run_dir)
    if not (run_dir / METRICS).is_file():
        raise ReportError(f"{run_dir}: no {METRICS} here (expected a run's output_dir)")
    rows = _readable_rows(run_dir / METRICS)
    if not rows:
        raise ReportError(f"{run_dir / METRICS}: no steps logged yet")
    return {"dir": run_dir, "rows": rows, "samples": _readable_rows(run_dir / COMPLETIONS)}


def _readable_rows(path: Path) -> list[dict]:
    """A log's rows; damaged lines (a run killed mid-write, a disk error) are skipped with a
    warning naming them, so the rest of the run is still plotted."""
    damaged = []
    rows = read_jsonl(path, damaged)
    if damaged:
        print(f"mlx-grpo: warning: {path}: skipped damaged line{'s' * (len(damaged) > 1)} "
              f"{', '.join(map(str, damaged))}", file=sys.stderr)
    return rows


def run_labels(dirs) -> list[str]:
    """Each run's folder name, or its path below the common parent where names repeat."""
    names = [Path(d).name for d in dirs]
    if len(set(names)) == len(names):
        return names
    if len(dirs) == 1:
        return [str(dirs[0])]
    common = os.path.commonpath([os.path.abspath(d) for d in dirs])
    return [os.path.relpath(os.path.abspath(d), common) for d in dirs]


def series(rows, key) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that logged `key` with a finite value."""
    pts = [(r["step"], r[key]) for r in rows
           if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [s for s, _ in pts], [v for _, v in pts]


def smooth(values, span: float | None = None) -> list[float]:
    """Debiased exponential moving average; the span grows with the run (a tenth of it, 3 to 50)."""
    span = span if span is not None else min(max(len(values) / 10, 3.0), 50.0)
    alpha = 2.0 / (span + 1.0)
    out, avg, weight = [], 0.0, 0.0
    for v in values:
        avg = (1 - alpha) * avg + alpha * v
        weight = (1 - alpha) * weight + alpha
        out.append(avg / weight)
    return out


def panel_keys(runs) -> list[tuple[str, str]]:
    present = {k for run in runs for r in run["rows"] for k in r}
    fixed = [(k, title) for k, title in PANELS if k in present]
    per_fn = sorted(k for k in present if k.startswith("rewards/") and k.endswith("/mean"))
    evals = sorted(k for k in present if k.startswith("eval/"))
    total = [p for p in fixed if p[0] == "reward"]
    rest = [p for p in fixed if p[0] != "reward"]
    return (total + [(k, f"reward: {k.split('/')[1]}") for k in per_fn] + rest
            + [(k, k) for k in evals])


def draw(runs, labels):
    """The figure: one panel per metric, every run overlaid."""
    plt = require_matplotlib()
    from matplotlib.ticker import MaxNLocator

    keys = panel_keys(runs)
    nrows = math.ceil(len(keys) / COLUMNS)
    fig, axes = plt.subplots(nrows, COLUMNS, figsize=(5.2 * COLUMNS, 3.3 * nrows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, title) in zip(axes.flat, keys):
        for i, run in enumerate(runs):
            steps, values = series(run["rows"], key)
            if not steps:
                continue
            color = colors[i % len(colors)]
            few = len(steps) <= 20  # short runs and sparse eval points: show each point
            ax.plot(steps, values, color=color, alpha=0.25, linewidth=1, marker="o" if few else None,
                    markersize=3)
            ax.plot(steps, smooth(values), color=color, linewidth=1.8, label=labels[i])
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps, never 1.25
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if key in FRACTIONS:
            ax.set_ylim(-0.02, 1.02)
        elif key in NONNEGATIVE:
            ax.set_ylim(bottom=0)
        if key == "learning_rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", ncol=min(len(names), 4), fontsize=9,
               bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (3.3 * nrows)))
    return fig


def run_summary(rows) -> dict:
    """The numbers a sweep table compares: final and best reward, eval, KL, time, memory."""
    steps, rewards = series(rows, "reward")
    best = max(range(len(rewards)), key=rewards.__getitem__) if rewards else None
    evals = {}
    for key in sorted({k for r in rows for k in r if k.startswith("eval/")}):
        _, values = series(rows, key)
        if values:
            evals[key] = values[-1]
    _, kl = series(rows, "kl")
    _, times = series(rows, "step_time")
    _, mem = series(rows, "peak_memory_gb")
    return {
        "steps": rows[-1]["step"],
        "final_reward": rewards[-1] if rewards else None,
        "best_reward": rewards[best] if rewards else None,
        "best_step": steps[best] if rewards else None,
        "eval": evals,
        "kl": kl[-1] if kl else None,
        "train_time_s": sum(times),
        "peak_memory_gb": max(mem) if mem else None,
    }


def fmt_cell(v, spec=".3f") -> str:
    """A table cell: the number formatted, or "-" where there is none (the sweep's table too)."""
    return "-" if v is None else format(v, spec)


def _png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def _group_html(prompt: str, rows) -> str:
    names = sorted({n for s in rows for n in s.get("rewards", {})})
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    body = "".join(
        f"<tr><td>{fmt_cell(s['reward'])}</td>"
        + "".join(f"<td>{fmt_cell(s.get('rewards', {}).get(n))}</td>" for n in names)
        + f"<td><pre>{html.escape(s['completion'])}</pre></td></tr>"
        for s in rows
    )
    return (f"<p><b>prompt</b></p><pre>{html.escape(prompt)}</pre>"
            f"<table><tr><th>reward</th>{head}<th>completion</th></tr>{body}</table>")


def _samples_html(samples) -> str:
    if not samples:
        return "<p>No sample completions logged (set <code>logging.log_completions</code> &gt; 0).</p>"
    steps = sorted({s["step"] for s in samples})
    if len(steps) > MAX_SAMPLE_STEPS:  # evenly spaced, first and last included
        picked = {steps[round(i * (len(steps) - 1) / (MAX_SAMPLE_STEPS - 1))] for i in range(MAX_SAMPLE_STEPS)}
        note = f"<p>{len(picked)} of {len(steps)} logged steps shown, evenly spaced.</p>"
        steps = sorted(picked)
    else:
        note = ""
    parts = [note]
    for step in steps:
        rows = [s for s in samples if s["step"] == step]
        mean = sum(s["reward"] for s in rows) / len(rows)
        groups = {}  # the samples of each prompt, in logged order
        for s in rows:
            groups.setdefault(s["prompt"], []).append(s)
        body = "".join(_group_html(prompt, group) for prompt, group in groups.items())
        parts.append(f"<details><summary>step {step}: mean reward {mean:.3f} over {len(rows)} samples"
                     f"</summary>{body}</details>")
    return "\n".join(parts)


def _summary_html(runs, labels) -> str:
    head = "<tr><th>run</th><th>steps</th><th>final reward</th><th>best reward (step)</th><th>KL</th>" \
           "<th>train time (s)</th><th>peak memory (GB)</th></tr>"
    body = ""
    for run, label in zip(runs, labels):
        s = run_summary(run["rows"])
        body += (f"<tr><td>{html.escape(label)}</td><td>{s['steps']}</td><td>{fmt_cell(s['final_reward'])}</td>"
                 f"<td>{fmt_cell(s['best_reward'])} ({s['best_step']})</td><td>{fmt_cell(s['kl'], '.4g')}</td>"
                 f"<td>{s['train_time_s']:.1f}</td><td>{fmt_cell(s['peak_memory_gb'], '.2f')}</td></tr>")
    return f"<table>{head}{body}</table>"


STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1600px} img{max-width:100%}"
         "table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ccc;padding:3px 8px;"
         "vertical-align:top;text-align:left} pre{white-space:pre-wrap;margin:0;max-width:900px}"
         "details{margin:.3em 0} summary{cursor:pointer}")


def render_html(runs, labels, png: bytes) -> str:
    image = base64.b64encode(png).decode("ascii")
    sections = "".join(
        f"<h2>Sample completions: {html.escape(label)}</h2>{_samples_html(run['samples'])}"
        for run, label in zip(runs, labels)
    )
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>mlx-grpo report</title>"
            f"<style>{STYLE}</style></head><body><h1>mlx-grpo report</h1>{_summary_html(runs, labels)}"
            f"<img alt='metrics' src='data:image/png;base64,{image}'>{sections}</body></html>")


def default_out(run_dirs) -> Path:
    """report.html in the run folder, or in the folder that holds all the runs."""
    if len(run_dirs) == 1:
        return Path(run_dirs[0]) / "report.html"
    return Path(os.path.commonpath([os.path.abspath(d) for d in run_dirs])) / "report.html"


def write_report(run_dirs, out=None) -> Path:
    """Plot the runs in `run_dirs` overlaid into `out` (.png or .html); returns the path."""
    if not run_dirs:
        raise ReportError("report: name at least one run folder")
    out = Path(out) if out is not None else default_out(run_dirs)
    if out.suffix.lower() not in (".png", ".html"):
        raise ReportError(f"--out {out}: expected a file name ending in .png or .html")
    runs = [load_run(d) for d in run_dirs]
    labels = run_labels(run_dirs)
    plt = require_matplotlib()
    fig = draw(runs, labels)
    png = _png_bytes(fig)
    plt.close(fig)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".png":
        out.write_bytes(png)
    else:
        out.write_text(render_html(runs, labels, png), encoding="utf-8")
    return out


def add_arguments(parser):
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a run's output_dir (several are overlaid)")
    parser.add_argument("--out", metavar="FILE", help="FILE.png or FILE.html (default: report.html in the run folder)")


def main(args):
    print(f"mlx-grpo report: wrote {write_report(args.runs, args.out)}")
