"""Metric sinks: ``metrics.jsonl`` (one object per step) and TensorBoard when it is installed.

A write that fails (a full disk, a read-only directory) raises :class:`~rlft.errors.WriteFailed` naming the file.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from rlft.runs.disk import flush_to_disk
from rlft.errors import WriteFailed, writing


class MetricsLog:
    def __init__(self, run_dir: Path, *, tensorboard: bool = True, filename: str = "metrics.jsonl"):
        self.path = Path(run_dir) / filename
        with writing(self.path):
            self._file = self.path.open("a", encoding="utf-8")
        self._failed = False
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional: metrics.jsonl is always written
                SummaryWriter = None
                logging.getLogger("rlft").warning(
                    "rlft: no tensorboard/ (log.tensorboard: tensorboard is not installed; metrics.jsonl has every "
                    "metric): pip install 'rlft[tensorboard]', or log.tensorboard=false")
            if SummaryWriter is not None:
                self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        bad = [k for k, v in metrics.items() if not math.isfinite(v)]
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        if bad:
            record["nonfinite_keys"] = bad  # kept visible rather than dropped
        try:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        except OSError as e:
            self._failed = True
            raise WriteFailed(self.path, e) from e
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        try:
            self._file.close()  # flushes what a failed write left in the buffer: it fails again, already reported
        except OSError as e:
            if not self._failed:
                raise WriteFailed(self.path, e) from e
        if self._tb is not None:
            self._tb.close()


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Drop lines logged after ``max_step`` (a resumed run re-logs the steps after its checkpoint), and a last line
    cut short by a kill in the middle of its write."""
    if not path.exists():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    keep = []
    for i, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):
                break  # the write the process was killed in
            raise ValueError(f"{path}, line {i}: not JSON ({e.msg}); the metrics file is damaged") from None
        if record["step"] <= max_step:
            keep.append(line)
    write_atomic(path, "".join(line + "\n" for line in keep))


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary sibling renamed over it: ``path`` holds the old text or the new,
    never part of it. A failed write removes the temporary file and raises WriteFailed naming ``path``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with writing(path):
            tmp.write_text(text, encoding="utf-8")
            flush_to_disk(tmp)  # the text is on the disk before the name points at it
            tmp.replace(path)
            flush_to_disk(path.parent, recursive=False)  # and the rename itself
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
