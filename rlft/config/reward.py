"""The ``reward`` section: the rewards a run scores with, as plain data (their callables are built by
``rlft.rewards.terms``)."""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Any, Literal

from rlft.config.checks import _check, plain

ScheduleKind = Literal["constant", "linear", "step", "until"]


@dataclass(frozen=True)
class WeightSchedule:
    """How a reward term's weight follows the RL step ``s`` (1 for the first step, as metrics.jsonl counts them).

    ``w`` is the term's weight (its own, else its ``reward.weights`` entry, else 1.0):

    - ``constant``: ``w`` at every step;
    - ``linear`` (a warm-up): ``value`` up to step ``at``, then a straight line to ``w`` over ``steps`` steps,
      ``w`` after; ``steps: 0`` switches from ``value`` to ``w`` after step ``at`` (Kimi k1.5's length-penalty
      warm-up: ``{kind: linear, at: N}``, off for the first N steps);
    - ``step``: ``w`` up to step ``at``, ``value`` after it (a step change);
    - ``until`` (off after a step): ``w`` up to step ``at``, 0 after it.

    >>> ramp = WeightSchedule("linear", at=10, steps=4)
    >>> [ramp.weight(2.0, s) for s in (1, 10, 11, 12, 14, 100)]
    [0.0, 0.0, 0.5, 1.0, 2.0, 2.0]
    >>> [WeightSchedule("until", at=3).weight(0.5, s) for s in (1, 3, 4)]
    [0.5, 0.5, 0.0]
    """

    kind: ScheduleKind = "constant"
    """constant, linear (a warm-up from value to the weight), step (the weight, then value) or until (the weight up to step at, then 0: off after a step)."""
    at: int = 0
    """The last step before the change: linear starts its ramp after it; step and off change the weight after it."""
    steps: int = 0
    """linear: steps the ramp takes from value to the weight (0: a switch after step `at`)."""
    value: float = 0.0
    """linear: the weight up to step `at`; step: the weight after step `at`."""

    def __post_init__(self) -> None:
        kinds = typing.get_args(ScheduleKind)
        _check(self.kind in kinds, "kind", f"must be one of {', '.join(kinds)}, got {self.kind!r}")
        _check(self.at >= 0, "at", f"must be >= 0, got {self.at}")
        _check(self.steps >= 0, "steps", f"must be >= 0, got {self.steps}")
        _check(math.isfinite(self.value), "value", f"must be a finite number, got {self.value!r}")
        for name in _UNUSED.get(self.kind, ()):
            _check(getattr(self, name) == getattr(WeightSchedule, name), name,
                   f"not used by kind={self.kind} (used by: {_USED_BY[name]})")

    def weight(self, w: float, step: int) -> float:
        """The weight at RL step ``step`` of a term whose weight is ``w``: a pure function of the step, so a run
        resumed at step s weighs as the uninterrupted run did."""
        if self.kind == "constant":
            return float(w)
        if self.kind == "linear":
            if step <= self.at:
                return float(self.value)
            if step >= self.at + self.steps:
                return float(w)
            return float(self.value + (w - self.value) * (step - self.at) / self.steps)
        after = self.value if self.kind == "step" else 0.0
        return float(w if step <= self.at else after)

    @property
    def constant(self) -> bool:
        return self.kind == "constant"

    def to_plain(self) -> dict[str, Any]:
        """The recipe form: the kind and the fields that differ from their defaults."""
        return {"kind": self.kind, **{k: getattr(self, k) for k in ("at", "steps", "value")
                                      if getattr(self, k) != getattr(WeightSchedule, k)}}


_UNUSED = {"constant": ("at", "steps", "value"), "step": ("steps",), "until": ("steps", "value")}
_USED_BY = {"at": "linear, step, until", "steps": "linear", "value": "linear, step"}


@dataclass(frozen=True)
class RewardTerm:
    """One entry of ``reward.fns``: a registered reward, its weight, its metric label and its own parameters.

    Written in a recipe as a plain name (``math``) or a mapping
    (``{name: partial_credit, weight: 1.0, tolerance: 1, partial: 0.5}``);
    ``label`` (default: the name) keys its metrics, ``reward/<label>/mean``, so
    one reward can appear twice with different parameters. ``schedule`` (a
    :class:`WeightSchedule` mapping, ``{kind: linear, at: 100, steps: 50}``)
    makes the weight a function of the RL step, logged as ``reward/<label>/weight``.
    """

    name: str
    weight: float | None = None
    """None: taken from reward.weights (or 1.0)."""
    label: str = ""
    params: tuple[tuple[str, Any], ...] = ()
    schedule: WeightSchedule = WeightSchedule()
    """How the weight follows the RL step (default: constant)."""

    def __post_init__(self) -> None:
        _check(bool(self.name), "name", "missing; every entry needs the reward's name")
        _check(self.weight is None or math.isfinite(self.weight),
               "weight", f"must be a finite number, got {self.weight!r}")
        _check(isinstance(self.schedule, WeightSchedule), "schedule",
               f"must be a WeightSchedule, got {type(self.schedule).__name__}")

    @property
    def key(self) -> str:
        return self.label or self.name

    def to_plain(self) -> str | dict[str, Any]:
        """The recipe form: the bare name when nothing else is set."""
        extra = {**({"weight": self.weight} if self.weight is not None else {}),
                 **({"label": self.label} if self.label else {}),
                 **({} if self.schedule.constant else {"schedule": self.schedule.to_plain()}), **dict(self.params)}
        return {"name": self.name, **{k: plain(v) for k, v in extra.items()}} if extra else self.name


@dataclass(frozen=True)
class RewardConfig:
    fns: tuple[RewardTerm, ...] = (RewardTerm("final_answer"), RewardTerm("format_final"))
    """Rewards (rlft.rewards.REWARDS), combined as a weighted sum: names, or mappings {name, weight, label, schedule, <params>}."""
    weights: tuple[float, ...] = (1.0, 0.1)
    """One weight per function, for entries that give none (empty: each entry's own weight, else 1.0)."""
    timeout_s: float = 5.0
    """A reward call slower than this costs its sample (scored as unscorable, counted)."""
    workers: int = 2
    """Worker processes for slow rewards and slow environment steps (marked runs_in_pool); the pool is started only when one is used."""
    sandbox: Literal["jail", "unjailed"] = "jail"
    """How code rewards run programs: 'jail' (bubblewrap + seccomp, a uid and limits per sample; the run stops
    at start where it cannot work, saying what to install) or 'unjailed' (plain processes with rlimits: the
    program can read this machine's files and use its network; logged). An entry's own sandbox wins."""

    def __post_init__(self) -> None:
        _check(len(self.fns) >= 1, "reward.fns", "needs at least one reward function")
        keys = [t.key for t in self.fns]
        dup = next((k for k in keys if keys.count(k) > 1), None)
        _check(dup is None, "reward.fns", f"{dup!r} appears twice; give each entry its own label")
        if self.weights:
            _check(len(self.weights) == len(self.fns), "reward.weights",
                   f"needs one weight per function ({len(self.fns)}), got {len(self.weights)}")
            own = next((t.key for t in self.fns if t.weight is not None), None)
            _check(own is None, "reward.weights",
                   f"reward.fns entry {own!r} sets its own weight; set weights in one place (reward.weights=[])")
        _check(self.timeout_s > 0, "reward.timeout_s", "must be > 0")
        _check(self.workers >= 1, "reward.workers", "must be >= 1")

    @property
    def resolved_weights(self) -> tuple[float, ...]:
        """The weight of each entry: its own, else reward.weights, else 1.0."""
        if self.weights:
            return self.weights
        return tuple(1.0 if t.weight is None else t.weight for t in self.fns)

    def weights_at(self, step: int) -> tuple[float, ...]:
        """The weight of each entry at RL step ``step`` (1: the first): ``resolved_weights`` through each entry's
        schedule.

        >>> cfg = RewardConfig(fns=(RewardTerm("a"), RewardTerm("b", schedule=WeightSchedule("linear", at=2))),
        ...                    weights=(1.0, 0.5))
        >>> cfg.weights_at(1), cfg.weights_at(2), cfg.weights_at(3)
        ((1.0, 0.0), (1.0, 0.0), (1.0, 0.5))
        """
        return tuple(t.schedule.weight(w, step) for t, w in zip(self.fns, self.resolved_weights))

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(t.key for t in self.fns)
