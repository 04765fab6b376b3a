"""The stage interface: every stage is ``fn(StageInput) -> StageResult``, registered with ``@stage(name, ...)``
together with what the pipeline must know about it (it trains a scorer, not a policy; it runs in every process;
it continues from its own checkpoints), so the pipeline has no special case for any stage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rlft.config import PIPELINE_LABELS, Config, ConfigError
from rlft.data.preferences import Ranking
from rlft.data.rankings import load_rankings
from rlft.data.schema import Example
from rlft.data.task import load_task
from rlft.insight.eval import HeldOut, evaluate_task, load_sets
from rlft.registry import Registry


@dataclass(frozen=True)
class Task:
    """``data.source``'s training and held-out problems and the extra held-out sets of ``eval.sets``, read once
    (by the pipeline, before anything is written) for every stage of a run."""

    train: list[Example]
    held_out: list[Example]
    sets: list[HeldOut]
    sft: list[Example] | None = None  # sft.source's rows, when a stage trains on them (None: not read here)
    rankings: Mapping[str, tuple[list[Ranking], list[Ranking]]] = field(default_factory=dict)  # rm/dpo.source's

    def rankings_of(self, cfg: Config, name: str) -> tuple[list[Ranking], list[Ranking]]:
        """(training, held-out) rankings of the rm or dpo stage ``name``: read already, or made from the task."""
        if name in self.rankings:
            return self.rankings[name]
        return load_rankings(cfg, getattr(cfg, name), name, task=(self.train, self.held_out))


@dataclass(frozen=True)
class StageInput:
    """What every stage gets."""

    cfg: Config
    model_dir: Path  # the policy the stage starts from
    out_dir: Path  # where it writes: the run directory itself for a one-stage run, else <run>/<i>-<stage>/
    start: dict | None = None  # the held-out task metrics of model_dir, when an earlier stage measured them
    scorers: Mapping[str, Path] = field(default_factory=dict)  # "rm" / "prm" -> the model an earlier stage trained;
    # "label" -> the preferences directory an earlier label stage wrote
    resume: bool = False  # continue from the last checkpoint in out_dir (stages registered with resumes=True)
    warm_up: bool = False  # RL: the SFT warm-up (sft.steps) first, in this stage's directory
    echo: Callable[..., None] = print
    task: Task | None = None  # None: the stage reads the task itself

    @property
    def problems(self) -> Task:
        """The task's problems: the pipeline's, else read now."""
        if self.task is not None:
            return self.task
        return Task(*load_task(self.cfg), load_sets(self.cfg))


@dataclass(frozen=True)
class StageResult:
    """What a stage leaves for the next one and for the run's summary."""

    model_dir: Path  # the model the next stage starts from (a scorer stage's: the scorer)
    metrics: dict[str, float] = field(default_factory=dict)  # held-out metrics after the stage
    summary: str = ""  # one line for people


@dataclass(frozen=True)
class Stage:
    """A registered stage and what the pipeline must know about it."""

    fn: Callable[[StageInput], StageResult]
    scorer: bool = False  # leaves no policy (rm, prm: a scorer; label: preferences): the next stage continues
    # from the policy before it, and the later ones find its result in StageInput.scorers under the stage's name
    every_process: bool = False  # runs in every process of a launch (data-parallel); the others in the main one
    resumes: bool = False  # continues from its checkpoints; the others start afresh when a run is resumed

    def __call__(self, inp: StageInput) -> StageResult:
        return self.fn(inp)


STAGES: Registry[Stage] = Registry("stage")


def stage(name: str, *, scorer: bool = False, every_process: bool = False,
          resumes: bool = False) -> Callable[[Callable[[StageInput], StageResult]], Callable]:
    """Register ``fn(StageInput) -> StageResult`` as the stage ``name``."""

    def deco(fn: Callable[[StageInput], StageResult]) -> Callable[[StageInput], StageResult]:
        STAGES.register(name)(Stage(fn, scorer=scorer, every_process=every_process, resumes=resumes))
        return fn

    return deco


def with_labels(cfg: Config, labels_dir: Path | None, name: str) -> Config:
    """``cfg`` with ``<name>.source`` '@label' replaced by ``labels_dir``, the preferences a label stage wrote
    earlier in the pipeline."""
    section = getattr(cfg, name)
    if section.source != PIPELINE_LABELS:
        return cfg
    if labels_dir is None:
        raise ConfigError(f"{name}.source: {PIPELINE_LABELS!r} reads the preferences of a pipeline's label stage, and "
                          f"no label stage runs before {name}: use stages: [..., label, {name}] or give a directory")
    return dataclasses.replace(cfg, **{name: dataclasses.replace(section, source=str(labels_dir))})


def task_metrics(policy, tokenizer, inp: StageInput) -> dict:
    """The rule-checked held-out evaluation of ``data.source``'s task (what ``rlft eval`` prints), with the extra
    sets of ``eval.sets`` under ``"sets"``."""
    task = inp.problems
    return evaluate_task(policy, tokenizer, inp.cfg, task.held_out, sets=task.sets)


def before_stage(path: Path, key: str, ckpt: Path | None, measure: Callable[[], dict]) -> dict:
    """The metrics of the stage's starting model: ``measure()``, kept under ``key`` in ``path`` (the stage's
    evaluation file, rewritten when it ends) so that a stage resumed from its checkpoint ``ckpt`` reads them back
    rather than measuring its resumed model."""
    import json

    from rlft.runs.start import write_json

    if ckpt is not None and path.is_file() and key in (saved := json.loads(path.read_text())):
        return saved[key]
    metrics = measure()
    write_json(path, {key: metrics})
    return metrics


@contextmanager
def step_log(out_dir: Path, filename: str, total: int = 0,
             show: bool = False) -> Iterator[Callable[[int, dict], None]]:
    """An ``on_step(step, metrics)`` callback writing ``out_dir/filename`` (steps counted from 1), closed after.

    With ``show``, a progress bar of ``total`` steps named after the file (``sft_metrics.jsonl``: sft), as RL
    has, showing the step's ``<stage>/loss``.
    """
    from tqdm.auto import tqdm

    from rlft.runs.tracking import MetricsLog

    log = MetricsLog(out_dir, filename=filename)
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
