"""MLflow: a run named after the run directory, in the experiment ``MLFLOW_EXPERIMENT_NAME`` (else ``rlft``), in
``sqlite:///<run>/mlflow.db`` (artifacts, none logged today, in ``<run>/mlflow_artifacts``) unless
``MLFLOW_TRACKING_URI`` is set. ``mlflow ui --backend-store-uri sqlite:///runs/<name>/mlflow.db``.

Through an ``MlflowClient`` of its own: a run of rlft neither needs nor changes the process's active MLflow run.
Metric names keep to MLflow's characters (``pass@4`` -> ``pass_at_4``, others -> ``_``); parameters are text, cut
at MLflow's 6000 characters. The final evaluation is logged as metrics at step 0. A resumed run continues the same
MLflow run (its id in trackers.json); MLflow keeps a parameter's first value, so a resume logs only the keys it
has not seen (resumes.jsonl has what a resume changed), and the steps after the checkpoint get a second value.
"""

from __future__ import annotations

import logging
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from rlft.runs.trackers.base import RunInfo, Stream, Tracker, text

EXPERIMENT = "rlft"
DB = "mlflow.db"
MAX_VALUE = 6000  # MLflow's longest parameter value
BATCH = 100  # MLflow's most parameters per log_batch (metrics: 1000)


def metric_name(key: str) -> str:
    """``key`` in the characters MLflow allows in a name (letters, digits, ``_ - . / :`` and spaces).

    >>> metric_name("val/max/pass@4")
    'val/max/pass_at_4'
    """
    return re.sub(r"[^\w\-./: ]", "_", key.replace("@", "_at_"))[:250]


class MlflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, run: RunInfo) -> None:
        super().__init__(run)
        with _quiet("mlflow.store.db.utils", "alembic"):  # "Creating initial MLflow database tables...": rlft says
            self._open(run)                                # where the run is

    def _open(self, run: RunInfo) -> None:
        local = not os.environ.get("MLFLOW_TRACKING_URI")
        self.uri = f"sqlite:///{Path(run.dir).resolve() / DB}" if local else os.environ["MLFLOW_TRACKING_URI"]
        self.client = MlflowClient(tracking_uri=self.uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment is not None else self.client.create_experiment(
            name, artifact_location=(Path(run.dir).resolve() / "mlflow_artifacts").as_uri() if local else None)
        same = run.state.get("tracking_uri") == _shown(self.uri)  # a resume to another store starts a new run
        saved = run.state.get("run_id") if run.resumed and same else None
        seen: dict[str, str] = {}
        if saved:
            seen = self.client.get_run(saved).data.params
            self.client.update_run(saved, status="RUNNING")
            self.run_id = saved
        else:
            self.run_id = self.client.create_run(experiment_id, run_name=run.name,
                                                 tags={"rlft.run_dir": str(run.dir)}).info.run_id
        params = [Param(k, text(v)[:MAX_VALUE]) for k, v in run.params.items() if k not in seen]
        for i in range(0, len(params), BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + BATCH])

    def where(self) -> str:
        return f"mlflow ui --backend-store-uri {_shown(self.uri)} (run {self.run_id})"

    def state(self) -> dict:
        return {"run_id": self.run_id, "tracking_uri": _shown(self.uri)}

    def log(self, stream: Stream, step: int, metrics: dict[str, float]) -> None:
        self._metrics(metrics, step)

    def summary(self, values: dict[str, float]) -> None:
        self._metrics(values, 0)

    def _metrics(self, values: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(metric_name(k), v, now, step) for k, v in values.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def _shown(uri: str) -> str:
    """``uri`` without the credentials a server's address may hold (``https://user:token@host`` -> ``https://host``)."""
    return re.sub(r"//[^/@]*@", "//", uri)


@contextmanager
def _quiet(*names: str) -> Iterator[None]:
    """The loggers ``names`` say only warnings while the block runs."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
