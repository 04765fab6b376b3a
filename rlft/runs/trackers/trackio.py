"""trackio: a run named after the run directory in the project ``rlft``, in trackio's own local store
(``TRACKIO_DIR``, by default ``~/.cache/huggingface/trackio``; a Space or server when ``TRACKIO_SPACE_ID`` or
``TRACKIO_SERVER_URL`` is set, as trackio itself decides). ``trackio show --project rlft``.

The configuration is the run's config; each metrics line a row at its stream's step; the final evaluation, trackio
having no summary, the run's last row. A resumed run continues the run of the same name (``resume="allow"``); the
steps after the checkpoint get a second row. trackio's own hardware logging is left off (rlft logs its timings),
and what it prints goes nowhere: rlft says where the run is.
"""

from __future__ import annotations

import contextlib
import io

import trackio

from rlft.runs.trackers.base import RunInfo, Stream, Tracker

PROJECT = "rlft"


class TrackioTracker(Tracker):
    name = "trackio"

    def __init__(self, run: RunInfo) -> None:
        super().__init__(run)
        with contextlib.redirect_stdout(io.StringIO()):
            self._run = trackio.init(project=PROJECT, name=run.name, config=dict(run.params),
                                     resume="allow" if run.resumed else "never", embed=False,
                                     auto_log_gpu=False, auto_log_cpu=False)

    def where(self) -> str:
        return f"trackio show --project {PROJECT} (run {self.run.name})"

    def log(self, stream: Stream, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def summary(self, values: dict[str, float]) -> None:
        self._run.log(values)

    def close(self, failed: bool) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            if trackio.context_vars.current_run.get() is self._run:
                trackio.finish()  # also forgets it as trackio's current run (else its exit hook finishes it again)
            else:
                self._run.finish()
