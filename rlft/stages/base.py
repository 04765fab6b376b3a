"""The stage interface: ``fn(cfg, model_dir, out_dir, echo, start) -> StageResult``, one registry of stages.

``start`` is the held-out task evaluation of ``model_dir`` when the caller has
it (a pipeline passes the previous stage's), so a stage does not evaluate the
same model again; None makes the stage evaluate it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    """The rule-checked held-out evaluation of ``data.source``'s task (what ``rlft eval`` prints), with the extra
    sets of ``eval.sets`` under ``"sets"``."""
    from rlft.insight.eval import evaluate_task
    from rlft.run import load_task

    _, eval_ex = load_task(cfg)
    return evaluate_task(policy, tokenizer, cfg, eval_ex)


def write_json(path: Path, obj: dict) -> None:
    """Write ``obj`` as JSON through a temporary file, so a reader never sees half of it (a failed write:
    ``WriteFailed`` naming ``path``)."""
    from rlft.runs.tracking import write_atomic

    write_atomic(path, json.dumps(obj, indent=2))


@contextmanager
def step_log(out_dir: Path, filename: str, total: int = 0,
             show: bool = False) -> Iterator[Callable[[int, dict], None]]:
    """An ``on_step(step, metrics)`` callback writing ``out_dir/filename`` (steps counted from 1), closed after.

    With ``show``, a progress bar of ``total`` steps named after the file (``sft_metrics.jsonl``: sft), as RL
    has, showing the step's ``<stage>/loss``.
    """
    from tqdm.auto import tqdm

    from rlft.runs.tracking import MetricsLog

    log = MetricsLog(out_dir, tensorboard=False, filename=filename)
    desc = filename.split("_")[0]
    bar = tqdm(total=total, desc=desc, disable=not show, dynamic_ncols=True)

    def on_step(step: int, metrics: dict) -> None:
        log.log(step + 1, metrics)
        bar.update(1)
        if f"{desc}/loss" in metrics:
            bar.set_postfix(loss=f"{metrics[f'{desc}/loss']:.3f}")

    try:
        yield on_step
    finally:
        bar.close()
        log.close()


def save_model(model, tokenizer, path: Path) -> Path:
    """``save_pretrained`` of both into ``path``; returns it."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_whole(path: Path, save: Callable[[Path], object]) -> Path:
    """``save(directory)`` into ``path`` through a temporary sibling (``rlft.runs.checkpoint.write_dir``): a full disk
    leaves no half-written model that a later stage or a resume would load, and raises ``WriteFailed``."""
    from rlft.runs.checkpoint import write_dir

    return write_dir(Path(path), save)
