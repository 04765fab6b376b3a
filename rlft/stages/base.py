"""The stage interface: ``fn(cfg, model_dir, out_dir, echo) -> StageResult``, one registry of stages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlft.registry import Registry


@dataclass(frozen=True)
class StageResult:
    """What a stage leaves for the next one and for the run's summary."""

    model_dir: Path  # the model the next stage starts from
    metrics: dict[str, float] = field(default_factory=dict)  # held-out metrics after the stage
    summary: str = ""  # one line for people


StageFn = Callable[..., StageResult]
STAGES: Registry[StageFn] = Registry("stage")
