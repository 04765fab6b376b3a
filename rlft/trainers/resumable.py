"""Checkpoints of the trainers other than RL's: SFT (its stage and the RL run's warm-up), the reward model, DPO
and RFT.

Each trainer writes, through ``rlft.runs.checkpoint`` (a directory written whole or not at all), its model, its
optimizer and schedule, the random states and its place in the data (its own random generator, its step) every
``train.save_every`` of its steps (:func:`save_due`, the RL loop's rule) and when a stop signal arrives
(``rlft.runs.stop``: then it ends the run with exit 128 + the signal's number). With ``train.resume=true`` the
stage loads the newest one's model (``resumed_policy``) and the trainer continues at the step after it: the same
batches, the same weights as a run that was never stopped.

A stage flat in its run directory keeps them in ``<run>/checkpoints/step_N``, a pipeline's in
``<run>/<i>-<stage>/checkpoints/``; the RL run's SFT warm-up in ``<run>/warm_up/checkpoints/`` (``WARM_UP``), apart
from RL's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlft.config import Config
from rlft.runs import checkpoint, resume, stop
from rlft.runs.tracking import truncate_jsonl
from rlft.trainers.optim import follow_schedule
from rlft.trainers.policy import training_policy

WARM_UP = "warm_up"  # the directory of the SFT warm-up's checkpoints in an RL run


def save_due(cfg: Config, step: int, total: int) -> bool:
    """Whether a trainer writes a checkpoint after ``step`` of its ``total`` steps: every ``train.save_every``
    steps (-1: every 10% of ``total``), as the RL loop does, but not after the last (the stage saves its model
    then)."""
    every = cfg.train.checkpoint_interval(total)
    return bool(every) and step % every == 0 and step < total


def checkpoint_step(ckpt: Path) -> int:
    """The step a checkpoint directory ``step_N`` was written after."""
    return int(Path(ckpt).name.split("_")[-1])


def resume_point(root: Path, resume: bool, metrics: Path | None = None) -> Path | None:
    """The newest checkpoint under ``root`` when resuming (None: start afresh); ``metrics`` (a per-step JSONL log)
    loses the lines logged after it, which the resumed trainer logs again."""
    ckpt = checkpoint.latest(root) if resume else None
    if ckpt is not None and metrics is not None:
        truncate_jsonl(metrics, checkpoint_step(ckpt))
    return ckpt


def resumed_policy(cfg: Config, model_dir: str, ckpt: Path | None, work_dir: Path) -> tuple:
    """(policy, tokenizer) to train: ``model_dir``'s, or the checkpoint's when resuming (its LoRA adapters on the
    base of ``model_dir``; with roles, whose adapters come after the warm-up, the plain model it saved)."""
    if ckpt is not None and cfg.roles.multi_agent:
        return training_policy(cfg, str(ckpt / "policy"), None, work_dir)
    return training_policy(cfg, model_dir, ckpt, work_dir)


def saved_state(ckpt: Path) -> dict[str, Any]:
    """The trainer's state a checkpoint holds (its step, its data position and what it stored as ``fixed``)."""
    return checkpoint.load_state(ckpt)["trainer"]


class Checkpoints:
    """The checkpoints of one trainer's run of ``total`` steps, under ``root`` (None: none are written, as in a call
    from Python outside a stage; a stop signal still ends the loop). ``what`` names a step in messages ("SFT
    step"); ``fixed``: what the stage computed before training and stores in every checkpoint (DPO's reference
    log-probs), read back with :func:`saved_state`. ``optimizer`` and ``scheduler`` may be set by the trainer
    that makes them."""

    def __init__(self, root: Path | None, cfg: Config, what: str, total: int, *, model, tokenizer, optimizer=None,
                 scheduler=None, fixed: dict[str, Any] | None = None):
        self.root, self.cfg, self.what, self.total = None if root is None else Path(root), cfg, what, total
        self.model, self.tokenizer, self.optimizer, self.scheduler = model, tokenizer, optimizer, scheduler
        self.fixed = dict(fixed or {})

    def restore(self, ckpt: Path) -> dict[str, Any]:
        """Load the optimizer, schedule and random states of ``ckpt`` (its model is loaded by the stage); returns
        the trainer's own state as it saved it (``step`` and what it added)."""
        saved = checkpoint.load_state(ckpt)
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        follow_schedule(self.optimizer, self.scheduler)
        checkpoint.set_rng_state(saved["rng"])
        run_dir = self.cfg.log.path
        if self.root in (run_dir, run_dir / WARM_UP):  # a run flat in its directory: what changed, now it has loaded
            resume.record(run_dir, self.cfg, ckpt, saved["trainer"]["step"], print)
        return saved["trainer"]

    def attach(self, optimizer, scheduler, generator, resume: Path | None) -> int:
        """The trainer's optimizer and schedule, and ``generator`` (a torch.Generator: its order of batches), kept
        in this trainer's checkpoints as ``generator``; from ``resume``, their states restored. Returns the step to
        start at (0 without ``resume``)."""
        self.optimizer, self.scheduler = optimizer, scheduler
        if resume is None:
            return 0
        saved = self.restore(resume)
        generator.set_state(saved["generator"])
        return saved["step"]

    def after(self, step: int, state: dict[str, Any]) -> None:
        """``step`` steps done, the trainer's own state ``state`` (its data position): a checkpoint when one is due
        and, when a stop signal arrived, a checkpoint (unless just written) and the error that ends the run."""
        saved = self.save(step, state) if self.root is not None and save_due(self.cfg, step, self.total) else None
        signum = stop.requested()
        if signum is not None:
            raise self.stopped(signum, step, state, f"after {self.what} {step} of {self.total}", saved)

    def stopped(self, signum: int, step: int, state: dict[str, Any], where: str, saved: Path | None = None):
        """The error that ends the run on ``signum`` ``where``, after the checkpoint of ``step`` steps done (written
        now unless ``saved``; none without ``root``)."""
        if saved is None and self.root is not None:
            saved = self.save(step, state)
        return stop.halted(signum, where, saved)

    def save(self, step: int, state: dict[str, Any]) -> Path:
        return checkpoint.save(self.root, step, model=self.model, tokenizer=self.tokenizer, optimizer=self.optimizer,
                               scheduler=self.scheduler, trainer_state={**self.fixed, "step": step, **state},
                               keep=self.cfg.train.keep_checkpoints)
