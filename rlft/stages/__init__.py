"""Stages: each is ``fn(StageInput) -> StageResult`` (``rlft.stages.base``), registered in ``STAGES``; the pipeline
(``rlft.stages.pipeline``) is the one orchestrator that runs them."""

from rlft.stages.base import STAGES, StageInput, StageResult, stage  # noqa: F401
from rlft.stages import distill, dpo, label, prm, rft, rl, rm, sft  # noqa: E402,F401  (register the stages)
