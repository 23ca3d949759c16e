"""Experiment trackers, as TRL's `report_to`: `logging.report_to` names any of TensorBoard,
Weights & Biases and Trackio, and each gets what metrics.jsonl gets (every step's row) under
TRL's names (train/reward, train/loss; eval/* as they are), the resolved config at the start,
and the logged sample completions (those of completions.jsonl).

Each tracker is an optional extra (`uv sync --extra NAME`); one that is named but not installed
stops the run before any model loads, with the line that installs it. Where each writes:
TensorBoard event files in <output_dir>/tensorboard; W&B its run under <output_dir>/wandb (and
to its server unless WANDB_MODE=offline); Trackio its local store (TRACKIO_DIR, by default the
Hugging Face cache). The project is `logging.project`, the run's name `logging.run_name`, or
the output folder's name. Only rank 0 reports, as only rank 0 logs.
"""

import contextlib
from dataclasses import asdict
import importlib
import io
import json
import math
from pathlib import Path
import time

from mlx_grpo.errors import UserError


class TrackerError(UserError):
    """A tracker in logging.report_to that cannot run here."""


# The extra that installs each tracker, and the module that extra provides.
EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


def require(name: str):
    """The tracker's module; a missing one stops with the command that installs it."""
    try:
        return importlib.import_module(EXTRAS[name])
    except ImportError as e:
        raise TrackerError(f"logging.report_to names {name!r}, which is not installed: "
                           f"`uv sync --extra {name}` installs it ({e})") from e


def check_installed(report_to: list[str]) -> None:
    """Stop now, before any model loads, when a named tracker is not installed; the line names
    every missing one and the one command that installs them all."""
    missing = []
    for name in report_to:
        try:
            require(name)
        except TrackerError as e:
            missing.append((name, e))
    if len(missing) == 1:
        raise missing[0][1]
    if missing:
        names = ", ".join(repr(n) for n, _ in missing)
        extras = " ".join(f"--extra {n}" for n, _ in missing)
        raise TrackerError(f"logging.report_to names {names}, which are not installed: `uv sync {extras}` installs them")


def tracker_name(key: str) -> str:
    """A metrics.jsonl key as TRL users find it in a tracker: transformers' rewrite_logs puts
    training metrics under train/ (train/reward, train/loss) and eval metrics under eval/, which
    ours already carry (eval/accuracy stays eval/accuracy)."""
    return key if key.startswith("eval/") else f"train/{key}"


def _scalars(metrics: dict) -> dict[str, float]:
    """The numbers of a metrics row under their tracker names, without its step (each tracker
    takes the step apart)."""
    return {tracker_name(k): float(v) for k, v in metrics.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


SAMPLE_COLUMNS = ["step", "prompt", "completion", "reward"]


class TensorBoard:
    """Scalars per step; the config and the samples as text (TensorBoard's Text tab).

    The folder keeps the event files of earlier starts (a killed run, an overwritten one). Each
    start opens with a restart marker (a SessionLog START) at its first step, 0 for a fresh run
    and N + 1 after resuming from step N: TensorBoard then drops what earlier files hold from that
    step on, so no step is plotted twice. The marker is written twice, as TensorBoard takes the
    first one it reads (in a folder written before markers, the resumed run's) for the run's
    beginning. The config goes at that step too.
    """

    def __init__(self, out: Path, run_name: str, project: str, config: dict, start: int = 0):
        require("tensorboard")
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.logdir = out / "tensorboard"
        self.writer = EventFileWriter(str(self.logdir))
        restart = SessionLog(status=SessionLog.START)
        for _ in range(2):  # TensorBoard reads the first START of a folder as its beginning, not a restart
            self.writer.add_event(Event(wall_time=time.time(), step=start, session_log=restart))
        self._text("config", "```\n" + json.dumps(config, indent=2) + "\n```", step=start)
        self.where = f"tensorboard --logdir {self.logdir}"

    def _event(self, step: int, values: list) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))

    def _text(self, tag: str, text: str, step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.compat.proto.types_pb2 import DT_STRING

        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        tensor = TensorProto(dtype=DT_STRING, string_val=[text.encode()],
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        self._event(step, [Summary.Value(tag=tag, metadata=meta, tensor=tensor)])

    def log(self, step: int, scalars: dict[str, float]) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._event(step, [Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()])
        self.writer.flush()  # a killed run keeps every step it logged

    def samples(self, step: int, rows: list[dict]) -> None:
        cell = lambda v: str(v).replace("|", "\\|").replace("\n", "<br>")
        table = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * len(SAMPLE_COLUMNS)]
        table += ["| " + " | ".join(cell(r[c]) for c in SAMPLE_COLUMNS) + " |" for r in rows]
        self._text("completions", "\n".join(table), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandB:
    """A W&B run in <output_dir>/wandb; the samples as a wandb.Table per logged step."""

    def __init__(self, out: Path, run_name: str, project: str, config: dict):
        self.wandb = require("wandb")
        # console="off": W&B would otherwise wrap stdout and stderr, under the progress bar.
        settings = self.wandb.Settings(silent=True, console="off")
        self.run = self.wandb.init(project=project, name=run_name, dir=str(out), config=config, settings=settings)
        self.where = f"wandb run {self.run.name} in project {project}" + (
            f" (offline, in {Path(self.run.dir).parent})" if self.run.settings.mode == "offline" else f": {self.run.url}")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def samples(self, step: int, rows: list[dict]) -> None:
        table = self.wandb.Table(columns=SAMPLE_COLUMNS, data=[[r[c] for c in SAMPLE_COLUMNS] for r in rows])
        self.run.log({"completions": table}, step=step)

    def close(self) -> None:
        self.run.finish()


class Trackio:
    """A Trackio run in its local store (or wherever TRACKIO_* sends it)."""

    def __init__(self, out: Path, run_name: str, project: str, config: dict):
        self.trackio = require("trackio")
        with contextlib.redirect_stdout(io.StringIO()):  # its banner; one line of ours says where
            self.run = self.trackio.init(project=project, name=run_name, config=config, embed=False)
        self.where = f"trackio run {run_name} in project {project} (trackio show --project {project})"

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log({k: v for k, v in scalars.items() if math.isfinite(v)}, step=step)

    def samples(self, step: int, rows: list[dict]) -> None:
        table = self.trackio.Table(columns=SAMPLE_COLUMNS, data=[[r[c] for c in SAMPLE_COLUMNS] for r in rows])
        self.run.log({"completions": table}, step=step)

    def close(self) -> None:
        # trackio.finish, not run.finish: it also forgets the run, which trackio would
        # otherwise finish (and announce) again at exit.
        with contextlib.redirect_stdout(io.StringIO()):
            self.trackio.finish()


TRACKERS = {"tensorboard": TensorBoard, "wandb": WandB, "trackio": Trackio}


class Trackers:
    """The trackers of logging.report_to, fed together; none when the list is empty."""

    def __init__(self, cfg, say=print, first_step: int = 1):
        log = cfg.logging
        out = Path(cfg.output_dir)
        name = log.run_name or out.resolve().name
        config = asdict(cfg)
        self.open = []
        for t in log.report_to:
            try:
                # only TensorBoard's folder holds earlier starts; W&B and Trackio start a new run
                start = {"start": 0 if first_step == 1 else first_step} if t == "tensorboard" else {}
                self.open.append(TRACKERS[t](out, name, log.project, config, **start))
            except TrackerError:
                raise
            except Exception as e:  # e.g. W&B online without a login or a network: one line, naming it
                raise TrackerError(f"logging.report_to: {t} could not start: {type(e).__name__}: {e}") from e
            say(f"mlx-grpo: reporting to {self.open[-1].where}")

    def log(self, metrics: dict) -> None:
        """A metrics.jsonl row: its numbers, under their tracker names, at its step."""
        scalars = _scalars(metrics)
        for tracker in self.open:
            tracker.log(metrics["step"], scalars)

    def samples(self, step: int, rows: list[dict]) -> None:
        if rows:
            for tracker in self.open:
                tracker.samples(step, rows)

    def close(self) -> None:
        for tracker in self.open:
            tracker.close()
        self.open = []
