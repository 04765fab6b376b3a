"""Trackers: the libraries a run's records also go to (``log.report_to``), each a sink of :mod:`rlft.runs.tracking`'s
stream, one module per library, each imported only when named.

    tensorboard  <run>/tensorboard/<stream>/ event files (torch.utils.tensorboard)
    wandb        <run>/wandb/, offline unless W&B is configured online (rlft.runs.trackers.wandb)
    mlflow       sqlite:///<run>/mlflow.db, unless MLFLOW_TRACKING_URI is set
    trackio      trackio's local store (TRACKIO_DIR; by default ~/.cache/huggingface/trackio)

Each gets the resolved configuration as parameters (dotted keys) when the run starts, every line of every metrics
file with its step while it runs (named as :mod:`rlft.runs.trackers.base` says), and the final evaluation (each
stage's ``*eval.json``, flattened: ``eval/after_rl/exact_match``) when it finishes. Only the main process opens them.
A tracker that fails, when it starts or later, is dropped with one warning naming it and the error; the run goes
on (metrics.jsonl has every metric). What a resumed run needs to continue the same record (W&B's and MLflow's run
ids) is kept in ``<run>/trackers.json``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from rlft.config import Config
from rlft.config.extras import installed
from rlft.registry import Registry
from rlft.runs.resume import as_saved, flat
from rlft.runs.trackers.base import RunInfo, Stream, Tracker
from rlft.runs.tracking import sink, write_atomic

STATE = "trackers.json"

TRACKERS: Registry[Callable[[], type[Tracker]]] = Registry("tracker")
"""Tracker name (as log.report_to writes it) -> its class, imported when the name is looked up."""


@TRACKERS.register("tensorboard")
def _tensorboard() -> type[Tracker]:
    from rlft.runs.trackers.tensorboard import TensorBoardTracker

    return TensorBoardTracker


@TRACKERS.register("wandb")
def _wandb() -> type[Tracker]:
    from rlft.runs.trackers.wandb import WandbTracker

    return WandbTracker


@TRACKERS.register("mlflow")
def _mlflow() -> type[Tracker]:
    from rlft.runs.trackers.mlflow import MlflowTracker

    return MlflowTracker


@TRACKERS.register("trackio")
def _trackio() -> type[Tracker]:
    from rlft.runs.trackers.trackio import TrackioTracker

    return TrackioTracker


def chosen(report_to: tuple[str, ...]) -> list[str]:
    """The trackers ``log.report_to`` names, in order, ``auto`` read as tensorboard when it is installed (a warning
    when it is not)."""
    names: list[str] = []
    for name in report_to:
        if name == "auto":
            if not installed("torch.utils.tensorboard"):
                logging.getLogger("rlft").warning(
                    "rlft: no tensorboard/ (log.report_to=auto: tensorboard is not installed; metrics.jsonl has every "
                    "metric): pip install 'rlft[tensorboard]', or log.report_to=[]")
                continue
            name = "tensorboard"
        if name not in names:
            names.append(name)
    return names


class Trackers:
    """The open trackers of one run, as one sink: a call that raises drops its tracker with a warning."""

    def __init__(self, run_dir: Path, trackers: dict[str, Tracker]):
        self.run_dir = Path(run_dir)
        self.open = dict(trackers)

    def log(self, path: Path, step: int, metrics: dict[str, float]) -> None:
        stream = Stream.of(self.run_dir, path)
        if stream is not None and self.open:
            named = {stream.key(k): v for k, v in metrics.items()}
            self._each("logging", lambda t: t.log(stream, step, named))

    def rewind(self, path: Path, max_step: int) -> None:
        stream = Stream.of(self.run_dir, path)
        if stream is not None:
            self._each("rewinding", lambda t: t.rewind(stream, max_step))

    def final(self, stage_dirs: list[Path]) -> None:
        """The final evaluation of the stages in ``stage_dirs`` (their ``*eval.json``) to every tracker."""
        values = final_values(self.run_dir, stage_dirs)
        if values:
            self._each("logging the final evaluation", lambda t: t.summary(values))

    def close(self, failed: bool) -> None:
        self._each("closing", lambda t: t.close(failed))
        self.open.clear()

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        for name, tracker in list(self.open.items()):
            try:
                call(tracker)
            except Exception as e:  # noqa: BLE001  a tracker's failure of any kind costs a warning, never the run
                warn_failed(name, what, e)
                self.open.pop(name, None)
                if what != "closing":
                    try:
                        tracker.close(True)
                    except Exception:  # noqa: BLE001  already reported once: the first failure is the one said
                        pass


def warn_failed(name: str, what: str, error: BaseException) -> None:
    """The one warning of a tracker that failed."""
    first = (str(error).strip().splitlines() or [""])[0][:300]
    logging.getLogger("rlft").warning(
        f"rlft: warning: tracker {name} failed {what} ({type(error).__name__}: {first}); the run goes on without "
        f"it (metrics.jsonl has every metric)")


@contextmanager
def opened(cfg: Config, run_dir: Path, echo: Callable = print, main: bool = True) -> Iterator[Trackers]:
    """The trackers of ``cfg.log.report_to`` open for the run in ``run_dir`` while the block runs, reading every
    MetricsLog; closed at its end (as failed when it raises). ``main``: this is the main process (the others open
    none)."""
    if not main:
        yield Trackers(run_dir, {})
        return
    run_dir = Path(run_dir)
    info = RunInfo(dir=run_dir, name=run_dir.name, params=flat(as_saved(cfg)), resumed=cfg.train.resume)
    trackers = Trackers(run_dir, start(chosen(cfg.log.report_to), info, echo))
    with sink(trackers):
        try:
            yield trackers
        except BaseException:
            trackers.close(failed=True)
            raise
        trackers.close(failed=False)


def start(names: list[str], info: RunInfo, echo: Callable) -> dict[str, Tracker]:
    """Each tracker of ``names`` opened (one that cannot is left out with a warning); their states saved."""
    path = info.dir / STATE
    states = json.loads(path.read_text()) if info.resumed and path.is_file() else {}
    out: dict[str, Tracker] = {}
    for name in names:
        try:
            tracker = TRACKERS.get(name)()(dataclasses.replace(info, state=states.get(name, {})))
            state, where = tracker.state(), tracker.where()
        except Exception as e:  # noqa: BLE001  a tracker's failure of any kind costs a warning, never the run
            warn_failed(name, "to start", e)
            continue
        out[name] = tracker
        if state:
            states[name] = state
        if where:
            echo(f"rlft: {name}: {where}")
    if states:
        write_atomic(path, json.dumps(states, indent=1) + "\n")
    return out


def final_values(run_dir: Path, stage_dirs: list[Path]) -> dict[str, float]:
    """The numbers of each stage's ``*eval.json`` by flattened key: ``eval/after_rl/exact_match`` (a pipeline's
    stage: ``1-grpo/eval/after_rl/exact_match``, ``0-dpo/dpo_eval/task_after/exact_match``)."""
    values: dict[str, float] = {}
    for d in stage_dirs:
        stage = Stream.of(run_dir, Path(d) / "metrics.jsonl").stage
        for path in sorted(Path(d).glob("*eval.json")):
            values.update(_numbers(json.loads(path.read_text()), f"{stage}{path.stem}/"))
    return values


def _numbers(tree, prefix: str) -> dict[str, float]:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _numbers(sub, f"{prefix}{key}/").items()}
    if isinstance(tree, (int, float)) and not isinstance(tree, bool):
        return {prefix.rstrip("/"): float(tree)}
    return {}
