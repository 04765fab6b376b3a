"""Every reward of ``reward.fns`` tried on a few rows of the task before a run trusts it.

``rlft train`` (and every command whose stages score with ``reward.fns``) calls :func:`try_rewards` after reading
the task and before writing anything. Each reward is called on :data:`ROWS` training rows, spread over the data,
each with two completions: the row's reference answer (its ``response``, else its ``ground_truth``) and a
completion that answers nothing (:data:`DUMMY`); a group-level reward gets groups of ``algo.group_size``
completions, the two alternating. The calls go through ``score_batch`` exactly as in training: the same samples
(the row's fields, ``num_tokens``, ``mean_logp``), the same shapes, threads and time limits, and a reward marked
``runs_in_pool`` in the run's worker pool.

A reward that fails on every one of these calls -- it raises, runs past its time limit, returns something that is
not a number, a bool or None, or cannot be called with the run's arguments -- stops the run: a
:class:`~rlft.config.checks.ConfigError` (exit 2) naming the reward, the training row and what went wrong. A
reward that works on some of them is trusted: a wrong or unscorable answer on a dummy completion is a verdict,
and failures during training are counted and watched (``health.reward_fail_steps``).

Rewards that score with a model (:data:`MODEL_REWARDS`) are not tried: calling them loads the model (its
weights, a device's memory, minutes on a large one), which the run does once when it starts; their failures are
caught during training like any other reward's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from rlft.config.checks import ConfigError
from rlft.config.sections import Config
from rlft.rewards.base import is_group_level
from rlft.rewards.scoring import score_batch
from rlft.rewards.terms import built, reward_pool

ROWS = 3
"""Training rows each reward is tried on."""

DUMMY = "I do not know."
"""The completion that answers nothing, tried beside each row's reference answer."""

MODEL_REWARDS = ("reward_model", "process_reward_model", "judge")
"""Rewards not tried before training: calling them loads their model."""


TRIAL_MEAN_LOGP = -1.0
"""The trial completions' ``mean_logp``: the RL trainer gives each sample the sampler's mean token log-prob (a
confidence-weighted vote reads it); the trial's completions were not sampled, so they get a plausible one."""


def trial_rows(n: int, k: int = ROWS) -> list[int]:
    """``k`` row indices spread over ``n`` rows, first and last included.

    >>> trial_rows(100), trial_rows(2), trial_rows(0)
    ([0, 50, 99], [0, 1], [])
    """
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def try_rewards(cfg: Config, rows: Sequence[Mapping]) -> None:
    """Call every reward of ``cfg.reward.fns`` on :func:`trial_rows` of ``rows`` (the training rows as rewards see
    them, ``Example.to_mapping()``); a :class:`ConfigError` for the first reward that fails on all of them."""
    picked = trial_rows(len(rows))
    terms = [t for t in cfg.reward.fns if t.name not in MODEL_REWARDS]
    if not picked or not terms:
        return
    fns = dict(built(cfg.reward))  # as the run builds them, reward.sandbox applied
    quiet = logging.getLogger("rlft.rewards")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the verdict below is the one line; training logs its own
    try:
        with reward_pool(cfg):  # the run's worker pool, when a reward runs in it
            for term in terms:
                _try(term, fns[term.key], rows, picked, cfg)
    finally:
        quiet.setLevel(level)


def _try(term, fn, rows: Sequence[Mapping], picked: list[int], cfg: Config) -> None:
    """One reward on the trial rows; a ConfigError when it fails on every call."""
    G = cfg.algo.group_size if is_group_level(fn) else 2
    completions = [_reference(rows[i]) if j % 2 == 0 else DUMMY for i in picked for j in range(G)]
    samples = [{**rows[i], "num_tokens": len(c.split()), "mean_logp": TRIAL_MEAN_LOGP}
               for i, c in zip((i for i in picked for _ in range(G)), completions)]
    scored = score_batch(completions, samples, [(term.key, fn)], [1.0],
                         timeout_s=cfg.reward.timeout_s, group_size=G if is_group_level(fn) else 1)
    if scored.errors.get(term.key, 0) == len(completions):
        index, error = scored.first_errors[term.key]
        which = "its reference answer" if index % G % 2 == 0 else f"the completion {DUMMY!r}"
        raise ConfigError(
            f"reward.fns: reward {_named(term)} failed on all {len(completions)} trial calls before training "
            f"(training rows {', '.join(map(str, picked))}, each with its reference answer and a dummy "
            f"completion); first, on training row {picked[index // G]} with {which}: {error}")


def _named(term) -> str:
    """The term's label, and for a function of the user's own where it lives."""
    where = dict(term.params).get("fn")
    return f"{term.key!r}" + (f" ({where})" if where else "")


def _reference(row: Mapping) -> str:
    """The row's reference answer as the task writes it: its ``response``, else its ``ground_truth``."""
    return str(row.get("response") or row.get("ground_truth") or "")

