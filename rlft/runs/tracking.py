"""The run's metric stream: ``metrics.jsonl`` (and each stage's ``<stage>_metrics.jsonl``), one object per step, and
the sinks that read the same lines while a run is open (its trackers, :mod:`rlft.runs.trackers`).

A write that fails (a full disk, a read-only directory) raises :class:`~rlft.errors.WriteFailed` naming the file.
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Protocol

from rlft.runs.disk import flush_to_disk
from rlft.errors import WriteFailed, writing


class Sink(Protocol):
    """What else reads the stream: each line a MetricsLog writes, and each rewind of a resumed run."""

    def log(self, path: Path, step: int, metrics: dict[str, float]) -> None: ...

    def rewind(self, path: Path, max_step: int) -> None: ...


_SINKS: list[Sink] = []


@contextmanager
def sink(reader: Sink) -> Iterator[Sink]:
    """``reader`` gets every line written by any MetricsLog (its file's path, the step, the metrics) and every
    ``truncate_jsonl`` while the block runs."""
    _SINKS.append(reader)
    try:
        yield reader
    finally:
        _SINKS.remove(reader)


class MetricsLog:
    def __init__(self, run_dir: Path, *, filename: str = "metrics.jsonl"):
        self.path = Path(run_dir) / filename
        with writing(self.path):
            self._file = self.path.open("a", encoding="utf-8")
        self._failed = False

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
        for reader in _SINKS:
            reader.log(self.path, step, {k: float(v) for k, v in metrics.items()})

    def close(self) -> None:
        try:
            self._file.close()  # flushes what a failed write left in the buffer: it fails again, already reported
        except OSError as e:
            if not self._failed:
                raise WriteFailed(self.path, e) from e


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
    for reader in _SINKS:
        reader.rewind(path, max_step)


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
