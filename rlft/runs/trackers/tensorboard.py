"""TensorBoard: one event directory per metrics stream, ``<run>/tensorboard/<stream>/`` (``tensorboard/metrics/``
for RL, ``tensorboard/sft_metrics/`` for the warm-up, ...), so that each stream's steps are its own; the
configuration in each as hyperparameters (the HParams tab), the final evaluation in ``tensorboard/final/`` at step 0.

A resumed run's stream starts a new event file with ``purge_step`` at the step after its checkpoint: TensorBoard
drops the first run's points from there on, so each step shows once. ``tensorboard --logdir runs/<name>/tensorboard``.
"""

from __future__ import annotations

from typing import Any

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from rlft.runs.trackers.base import RunInfo, Stream, Tracker, text

FINAL = "final"


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, run: RunInfo) -> None:
        super().__init__(run)
        self.root = run.dir / "tensorboard"
        self._writers: dict[str, SummaryWriter] = {}
        self._purge: dict[str, int] = {}  # stream -> the first step a resumed run logs again

    def where(self) -> str:
        return f"tensorboard --logdir {self.root}"

    def _writer(self, name: str) -> SummaryWriter:
        writer = self._writers.get(name)
        if writer is None:
            writer = SummaryWriter(log_dir=str(self.root / name), purge_step=self._purge.pop(name, None))
            for summary in hparams(_hparams(self.run.params), {}):
                writer.file_writer.add_summary(summary)
            self._writers[name] = writer
        return writer

    def log(self, stream: Stream, step: int, metrics: dict[str, float]) -> None:
        writer = self._writer(stream.name)
        for key, value in metrics.items():
            writer.add_scalar(key, value, step)

    def rewind(self, stream: Stream, max_step: int) -> None:
        writer = self._writers.pop(stream.name, None)
        if writer is not None:
            writer.close()
        self._purge[stream.name] = max_step + 1

    def summary(self, values: dict[str, float]) -> None:
        writer = self._writer(FINAL)
        for key, value in values.items():
            writer.add_scalar(key, value, 0)

    def close(self, failed: bool) -> None:
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            writer.close()


def _hparams(params: dict[str, Any]) -> dict[str, Any]:
    """The configuration as TensorBoard's hyperparameters take it: numbers, text and booleans (lists as text)."""
    return {k: v if isinstance(v, (int, float, str, bool)) else text(v) for k, v in params.items()}
