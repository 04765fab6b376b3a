"""Metric sinks: ``metrics.jsonl`` (one object per step) and TensorBoard when it is installed."""

from __future__ import annotations

import json
import math
from pathlib import Path


class MetricsLog:
    def __init__(self, run_dir: Path, *, tensorboard: bool = True, filename: str = "metrics.jsonl"):
        self.path = Path(run_dir) / filename
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional: metrics.jsonl is always written
                SummaryWriter = None
            if SummaryWriter is not None:
                self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        bad = [k for k, v in metrics.items() if not math.isfinite(v)]
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        if bad:
            record["nonfinite_keys"] = bad  # kept visible rather than dropped
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        self._file.close()
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
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    tmp.replace(path)
