"""The ``reward`` section: the rewards a run scores with, as plain data (their callables are built by
``rlft.rewards.terms``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from rlft.config.checks import _check, plain


@dataclass(frozen=True)
class RewardTerm:
    """One entry of ``reward.fns``: a registered reward, its weight, its metric label and its own parameters.

    Written in a recipe as a plain name (``math``) or a mapping
    (``{name: partial_credit, weight: 1.0, tolerance: 1, partial: 0.5}``);
    ``label`` (default: the name) keys its metrics, ``reward/<label>/mean``, so
    one reward can appear twice with different parameters.
    """

    name: str
    weight: float | None = None
    """None: taken from reward.weights (or 1.0)."""
    label: str = ""
    params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        _check(bool(self.name), "name", "missing; every entry needs the reward's name")
        _check(self.weight is None or math.isfinite(self.weight),
               "weight", f"must be a finite number, got {self.weight!r}")

    @property
    def key(self) -> str:
        return self.label or self.name

    def to_plain(self) -> str | dict[str, Any]:
        """The recipe form: the bare name when nothing else is set."""
        extra = {**({"weight": self.weight} if self.weight is not None else {}),
                 **({"label": self.label} if self.label else {}), **dict(self.params)}
        return {"name": self.name, **{k: plain(v) for k, v in extra.items()}} if extra else self.name


@dataclass(frozen=True)
class RewardConfig:
    fns: tuple[RewardTerm, ...] = (RewardTerm("final_answer"), RewardTerm("format_final"))
    """Rewards (rlft.rewards.REWARDS), combined as a weighted sum: names, or mappings {name, weight, label, <params>}."""
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

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(t.key for t in self.fns)
