"""The one interface of a tracker, and the names its records take.

A run writes several metric streams, each a ``*metrics.jsonl`` file with its own steps counted from 1: RL's
``metrics.jsonl``, the SFT warm-up's ``sft_metrics.jsonl``, VAPO's ``critic_pretrain_metrics.jsonl``, and in a
pipeline each stage's files under ``<i>-<stage>/``. In a tracker they share one namespace, so each stream's keys get
a prefix (:class:`Stream`): the stage's directory, and the file's own name where its keys do not already start with
it. RL's keys in a run without stages stay as metrics.jsonl has them (``reward/mean``); the warm-up's already read
``sft/loss``; the critic's pre-training becomes ``critic_pretrain/critic/vf_loss``; a pipeline's second stage
``1-grpo/reward/mean``. Each stream's step is its own (``Stream.step_key`` names it where a library needs it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Stream:
    """One metrics file of a run, as trackers name it."""

    name: str  # its path in the run directory without .jsonl: "metrics", "sft_metrics", "1-grpo/metrics"
    stage: str = ""  # "1-grpo/" in a pipeline; "" in a run without stages
    own: str = ""  # the file's name without _metrics.jsonl ("sft", "critic_pretrain"); "" for metrics.jsonl

    @classmethod
    def of(cls, run_dir: Path, path: Path) -> "Stream | None":
        """The stream of ``path``, None for a file that is not a metrics stream of the run in ``run_dir``."""
        path = Path(path)
        if not (path.name == "metrics.jsonl" or path.name.endswith("_metrics.jsonl")):
            return None
        try:
            rel = path.resolve().relative_to(Path(run_dir).resolve())
        except ValueError:  # another run's, written in this process while this one is open
            return None
        stage = "".join(f"{part}/" for part in rel.parent.parts)
        own = rel.name.removesuffix(".jsonl").removesuffix("metrics").removesuffix("_")
        return cls(name=rel.with_suffix("").as_posix(), stage=stage, own=own)

    def key(self, metric: str) -> str:
        """``metric``'s name in a tracker."""
        if self.own and not metric.startswith(f"{self.own}/"):
            metric = f"{self.own}/{metric}"
        return self.stage + metric

    @property
    def step_key(self) -> str:
        """The name of the stream's step: ``step`` for RL's metrics.jsonl, ``sft/step``, ``1-grpo/step``, ..."""
        return self.stage + (f"{self.own}/" if self.own else "") + "step"


@dataclass(frozen=True)
class RunInfo:
    """What a tracker is opened with."""

    dir: Path  # the run directory
    name: str  # the run's name: its directory's
    params: dict[str, Any]  # the resolved configuration, dotted keys (config.yaml flattened)
    resumed: bool  # train.resume: the run continues from a checkpoint
    state: dict = field(default_factory=dict)  # what this tracker stored when the run started before (trackers.json)


class Tracker(ABC):
    """One library. Opened with the run (``__init__`` raises when it cannot), then any number of ``log``, ``rewind``
    and one ``summary``, closed once. Every call may raise: the caller drops the tracker with a warning."""

    name = ""

    def __init__(self, run: RunInfo) -> None:
        self.run = run

    def where(self) -> str:
        """One line for the console: where the records are and how to look at them."""
        return ""

    def state(self) -> dict:
        """What a resumed run needs to continue the same record (a run id), kept in the run's trackers.json."""
        return {}

    @abstractmethod
    def log(self, stream: Stream, step: int, metrics: dict[str, float]) -> None:
        """One line of ``stream``: ``metrics`` already named by ``stream.key``."""

    def rewind(self, stream: Stream, max_step: int) -> None:
        """A resumed run logs ``stream``'s steps after ``max_step`` again (metrics.jsonl dropped them)."""

    @abstractmethod
    def summary(self, values: dict[str, float]) -> None:
        """The final evaluation (``eval/after_rl/exact_match``, ...), once, at the end of a finished run."""

    @abstractmethod
    def close(self, failed: bool) -> None:
        """The end of the run (``failed``: it ended on an error or a stop)."""


def text(value: Any) -> str:
    """A parameter's value as text, for libraries whose parameters are strings or plain scalars."""
    import json

    return value if isinstance(value, str) else json.dumps(value)
