"""Stages around RL: each reads a model directory and its configuration section and writes a model directory,
metrics and a one-line summary (``StageResult``); nothing else about the run."""

from rlft.stages.base import STAGES, StageResult  # noqa: F401
from rlft.stages import dpo, prm, rft, rl, rm, sft  # noqa: E402,F401  (register the stages)
