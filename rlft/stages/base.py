"""The stage interface: ``fn(cfg, model_dir, out_dir, echo) -> StageResult``, one registry of stages."""

from __future__ import annotations

import json
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


def task_metrics(policy, tokenizer, cfg) -> dict:
    """The rule-checked held-out evaluation of ``data.source``'s task (what ``rlft eval`` prints)."""
    from rlft.data.templates import encode_prompts
    from rlft.eval import evaluate
    from rlft.run import load_task

    _, eval_ex = load_task(cfg)
    prompts = encode_prompts(eval_ex, cfg.data.template, tokenizer, cfg.data.max_prompt_tokens, "eval data")
    return {k: v for k, v in evaluate(policy, tokenizer, prompts, eval_ex, cfg).items() if k != "examples"}


def write_json(path: Path, obj: dict) -> None:
    """Write ``obj`` as JSON through a temporary file, so a reader never sees half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    tmp.replace(path)
