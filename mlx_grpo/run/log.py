"""What a run tells its user: metrics.jsonl (one JSON object per step), completions.jsonl
(the sample completions of each logged step, with their rewards) and the console."""

import json
import math
import os
from pathlib import Path

from tqdm.utils import disp_len

from mlx_grpo.errors import naming
from mlx_grpo.run.console import WIDTH, fit, pack
from mlx_grpo.run.layout import COMPLETIONS, DAMAGED_SUFFIX, METRICS


class MetricsLog:
    """Appends one JSON line per step to `<output_dir>/metrics.jsonl`."""

    def __init__(self, output_dir, fresh: bool = True):
        self.path = Path(output_dir) / METRICS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fresh:
            with naming(self.path):
                self.path.write_text("")

    def write(self, metrics: dict):
        # JSON has no NaN; a non-finite value is written as null so the file stays valid.
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in metrics.items()}
        with naming(self.path), self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")


class CompletionLog:
    """Appends the logged sample completions to `<output_dir>/completions.jsonl`, one line each:
    {"step", "prompt", "completion", "reward", "rewards": {name: score, null where it gave none}},
    and with tools the episode's "messages" (assistant and tool turns), "turns" and "tool_calls"."""

    def __init__(self, output_dir, fresh: bool = True):
        self.path = Path(output_dir) / COMPLETIONS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fresh:
            with naming(self.path):
                self.path.write_text("")

    def write(self, step: int, prompts, completions, rewards, per_name: dict, count: int,
              episodes: list[dict] | None = None) -> list[dict]:
        """The first `count` samples of a step; per_name maps each reward's name to its scores;
        `episodes` (a tool rollout's, per row) adds each episode's messages. Returns the rows written."""
        rows = [{"step": step, "prompt": prompts[i], "completion": completions[i], "reward": float(rewards[i]),
                 "rewards": {name: None if scores[i] is None else float(scores[i]) for name, scores in per_name.items()}}
                for i in range(min(count, len(completions)))]
        for row, e in zip(rows, episodes or []):
            row.update(messages=e["messages"], turns=e["turns"], tool_calls=e["tool_calls"])
        with naming(self.path), self.path.open("a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        return rows


def read_jsonl(path, damaged: list[int] | None = None) -> list[dict]:
    """The rows of a JSON-lines file; a missing file has none.

    With a `damaged` list, a line that is not a JSON object (cut short by a kill, bad bytes) is
    skipped and its number appended there, for the caller to warn about; without one it raises.
    """
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"line {number} is not a JSON object")
        except ValueError:  # bad JSON or bytes (UnicodeDecodeError is a ValueError too)
            if damaged is None:
                raise
            damaged.append(number)
            continue
        rows.append(row)
    return rows


def truncate_jsonl(path, last_step: int) -> list[int]:
    """Keep the rows of a JSON-lines log up to `last_step`, so a resumed run writes no step twice.

    Valid rows after the checkpoint are dropped (the resumed run writes them again). A line that
    is not a JSON object with a step (damaged, or cut short by a kill) is moved, as it was, to
    `<path>.damaged`, never deleted; the rows around it stay. Returns those lines' numbers.
    """
    path = Path(path)
    if not path.exists():
        return []
    kept, damaged = [], []
    for number, line in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step = row["step"]
        except (ValueError, TypeError, KeyError):  # bad JSON or bytes, not an object, no step
            damaged.append((number, line))
            continue
        if isinstance(step, int) and step <= last_step:
            kept.append(line + b"\n")
    if damaged:
        with naming(str(path) + DAMAGED_SUFFIX), open(str(path) + DAMAGED_SUFFIX, "ab") as f:
            f.writelines(line + b"\n" for _, line in damaged)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with naming(path):
            tmp.write_bytes(b"".join(kept))
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)  # a kill while rewriting keeps the old file whole
    return [number for number, _ in damaged]


def read_metrics(output_dir) -> list[dict]:
    """The rows of a run folder's metrics.jsonl."""
    return read_jsonl(Path(output_dir) / METRICS)


def format_step(m: dict, width: int = WIDTH) -> list[str]:
    """The console lines of a logged step, each at most `width` columns."""
    parts = [f"step {m['step']}", f"loss {m['loss']:.4f}", f"reward {m['reward']:.3f}"]
    for key in sorted(k for k in m if k.startswith("rewards/") and k.endswith("/mean")):
        parts.append(f"{key.split('/')[1]} {m[key]:.3f}")
    if "kl" in m:
        parts.append(f"kl {m['kl']:.4f}")
    if "entropy" in m:
        parts.append(f"entropy {m['entropy']:.3f}")
    parts += [
        f"len {m['completions/mean_length']:.1f}",
        f"grad {m['grad_norm']:.3f}",
        f"lr {m['learning_rate']:.2e}",
        f"{m['step_time']:.2f}s",
        f"{m['peak_memory_gb']:.2f}GB",
    ]
    if "tools/call_frequency" in m:  # tool calls per episode, and the share of them that failed
        parts.append(f"tools {m['tools/call_frequency']:.2f}/ep fail {m['tools/failure_frequency']:.2f}")
    if "time/judge" in m:  # the judge reward's share of the step
        parts.append(f"judging {m['time/judge']:.2f}s")
    return pack(parts, width)


# Short console names of the eval metrics; rewards/NAME/mean shows as NAME.
_EVAL_NAMES = {"num_prompts": "prompts", "completions/mean_length": "len"}


def format_eval(m: dict, width: int = WIDTH) -> list[str]:
    """The console lines of a step's eval/* metrics, led by the step they belong to."""
    parts = [f"step {m['step']} eval"]
    for key, value in m.items():
        if not key.startswith("eval/"):
            continue
        name = key.removeprefix("eval/")
        if name.startswith("rewards/") and name.endswith("/mean"):
            name = name.split("/")[1]
        name = _EVAL_NAMES.get(name, name)
        parts.append(f"{name} {value:.3f}" if isinstance(value, float) else f"{name} {value}")
    return pack(parts, width)


def episode_text(messages: list[dict]) -> str:
    """An episode on one line: the model's turns as they are, each tool message marked
    `[tool NAME: CONTENT]`, so what the model wrote and what a tool answered stay apart."""
    return " ".join(m["content"] if m["role"] == "assistant" else f"[tool {m.get('name') or '?'}: {m['content']}]"
                    for m in messages)


def format_sample(question: str, completion: str, reward: float, width: int = WIDTH) -> list[str]:
    """A sample's two console lines, its prompt and completion, each within `width` columns
    (completions.jsonl keeps them whole). A completion too long for its line shows its start and
    its end, `'<reasoning>\\n9 - 5' ... '<answer>\\n4\\n</answer>'`: the end is what the rewards
    read, so it gets the larger share of the line."""
    lead = f"--- completion (reward {reward:.3f}): "
    room = width - disp_len(lead)
    shown = lead + _ends(completion, room) if room >= 20 else fit(lead + repr(completion), width)
    return [fit(f"--- prompt: {question!r}", width), shown]


def _ends(text: str, width: int) -> str:
    """repr(text) if it fits in `width` columns, else the reprs of its start and its end joined
    by " ... ", together at most `width` columns."""
    if disp_len(repr(text)) <= width:
        return repr(text)
    room = width - len(" ... ")
    tail = _piece(text, room * 3 // 5, from_end=True)
    head = _piece(text, room - disp_len(repr(tail)), from_end=False)
    return f"{head!r} ... {tail!r}"


def _piece(text: str, width: int, from_end: bool) -> str:
    """The longest start (or end) of `text` whose repr fits in `width` columns. A character
    takes at least one column, so no piece is longer than `width` characters."""
    for n in range(min(len(text), width), 0, -1):
        piece = text[-n:] if from_end else text[:n]
        if disp_len(repr(piece)) <= width:
            return piece
    return ""


def _window(rows: list[dict], key: str) -> tuple[float, float, int] | None:
    """(mean of the first w logged values, mean of the last w, w): w = 10, or half a short run's."""
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    if not values:
        return None
    w = min(10, max(1, len(values) // 2))
    return sum(values[:w]) / w, sum(values[-w:]) / w, w


def format_summary(rows: list[dict], wall_seconds: float, max_steps: int, checkpoint, warnings: int,
                   stopped: bool = False) -> list[str]:
    """The end of a run on the console: steps, wall time, the reward and each reward's first ->
    last window, the steps skipped for want of signal, the best eval reward, the final checkpoint
    and the warnings count."""
    minutes, seconds = divmod(round(wall_seconds), 60)
    last = rows[-1]["step"] if rows else 0
    lines = [f"mlx-grpo: {'stopped' if stopped else 'done'} after step {last} of {max_steps}, "
             f"{minutes}m{seconds:02d}s wall time, {warnings} warning{'s' * (warnings != 1)}"]
    window = _window(rows, "reward")
    if window:
        first, final, w = window
        lines.append(f"mlx-grpo: reward {first:.3f} -> {final:.3f} (mean of the first {w} logged steps "
                     f"-> the last {w})")
        for key in sorted(k for k in rows[-1] if k.startswith("rewards/") and k.endswith("/mean")):
            name, scored = key.split("/")[1][:40], _window(rows, key)
            if scored is None:  # None for every completion of every step
                lines.append(f"mlx-grpo:   {name} scored no completion (None for every one)")
                continue
            lines.append(f"mlx-grpo:   {name} {scored[0]:.3f} -> {scored[1]:.3f}")
    skipped = [r for r in rows if "zero_signal_skipped" in r]
    if skipped:
        n = sum(bool(r["zero_signal_skipped"]) for r in skipped)
        lines.append(f"mlx-grpo: {n} of {len(skipped)} steps without reward spread (beta = 0): update skipped "
                     "(training.skip_zero_signal_steps)")
    evals = [r for r in rows if isinstance(r.get("eval/reward"), (int, float))]
    if evals:
        best = max(evals, key=lambda r: r["eval/reward"])
        lines.append(f"mlx-grpo: best eval/reward {best['eval/reward']:.3f} at step {best['step']}")
    lines.append(f"mlx-grpo: final checkpoint {checkpoint}" if checkpoint else "mlx-grpo: no checkpoint written")
    return lines
