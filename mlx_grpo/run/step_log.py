"""Rank 0's record of a run while it trains: config.toml, metrics.jsonl, completions.jsonl, the
trackers, and on the console each logged step's line, its samples, its eval line and the live
warnings and tripwires; the end-of-run summary."""

from pathlib import Path
import time

from mlx_grpo.config import save_config
from mlx_grpo.run.console import Console, say, width
from mlx_grpo.run.layout import CONFIG
from mlx_grpo.run.log import (
    CompletionLog, MetricsLog, episode_text, format_eval, format_sample, format_step, format_summary, read_metrics,
)
from mlx_grpo.run.trackers import Trackers
from mlx_grpo.run.tripwires import Tripwires
from mlx_grpo.run.watch import RunWatcher


class StepLog:
    """Rank 0's record of the run: config.toml, metrics.jsonl, completions.jsonl, the console,
    the live warnings and the tripwires."""

    def __init__(self, cfg, first: int):
        out = self.out = Path(cfg.output_dir)
        fresh = first == 1
        self.started = time.perf_counter()
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / CONFIG)
        self.metrics, self.samples = MetricsLog(out, fresh=fresh), CompletionLog(out, fresh=fresh)
        self.watchers = (RunWatcher.from_config(cfg.logging), Tripwires.from_config(cfg.logging))
        self.trackers = Trackers(cfg, say, first)  # logging.report_to: each gets what metrics.jsonl gets
        self.every, self.completions = cfg.logging.log_every, cfg.logging.log_completions
        self.unscored = [0, 0]  # steps, completions the judge gave no score (warned once, judge/unparsed)

    def write(self, metrics: dict, drawn, console: Console, trained: bool) -> None:
        """The step's row and samples on file; on the console its line (every log_every steps),
        then its eval line, then any warnings."""
        self.metrics.write(metrics)
        if metrics.get("judge/unparsed"):
            self.unscored = [self.unscored[0] + 1, self.unscored[1] + int(metrics["judge/unparsed"])]
        self.trackers.log(metrics)
        console.done(reward=f"{metrics['reward']:.3f}", step_time=f"{metrics['step_time']:.2f}s")
        step = metrics["step"]
        if step % self.every == 0 and trained:
            console.print("\n".join(format_step(metrics, width())))
            episodes = drawn.rollout.episodes  # with tools: the turns, tool messages marked
            for i in range(min(self.completions, len(drawn.rollout.texts))):
                text = episode_text(episodes[i]["messages"]) if episodes else drawn.rollout.texts[i]
                sample = format_sample(drawn.questions[i], text, drawn.rewards[i], width())
                console.print("\n".join(sample))
            rows = self.samples.write(step, drawn.questions, drawn.rollout.texts, drawn.rewards, drawn.per_name,
                                      self.completions, episodes)
            self.trackers.samples(step, rows)
        if any(key.startswith("eval/") for key in metrics):
            console.print("\n".join(format_eval(metrics, width())))
        for watcher in self.watchers:
            for warning in watcher.update(metrics):
                console.print(warning)

    def finish(self, ckpt, max_steps: int, stopped: bool = False) -> None:
        """The end-of-run summary; after a clean stop too."""
        self.trackers.close()
        for watcher in self.watchers:
            if watcher.summary():
                say(watcher.summary())
        steps, completions = self.unscored
        if steps:
            say(f"mlx-grpo: the judge gave no score for {completions} completions in {steps} steps (judge/unparsed)")
        warnings = sum(sum(w.counts.values()) for w in self.watchers) + steps
        for line in format_summary(read_metrics(self.out), time.perf_counter() - self.started, max_steps,
                                   ckpt, warnings, stopped):
            say(line)
