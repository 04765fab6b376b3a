"""The maths of the prompt samplers (``data.sampler``): each training prompt's probability of being drawn.

Kimi k1.5 (Kimi Team 2025, "Sampling Strategies") names two: *curriculum sampling* trains on easy problems first
and widens to harder ones, *prioritised sampling* draws problem i with probability proportional to 1 - s_i, s_i
its success rate so far. Pure functions of a (N,) pass-rate vector, one per training prompt; NaN means unknown
(a prompt no rollout has scored yet, with no difficulty estimate). ``rlft.data.samplers`` draws from them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def prioritised_probs(pass_rate: Tensor, floor: float) -> Tensor:
    """(N,) -> (N,): p_i proportional to max(1 - s_i, floor) (Kimi k1.5: p_i ~ 1 - s_i).

    The floor keeps a prompt every sample solves (s_i = 1) drawable, at ``floor`` times the weight of one never
    solved; an unknown pass rate (NaN) counts as 0, so unseen prompts get the largest weight.

    >>> prioritised_probs(torch.tensor([0.0, 0.5, 1.0]), 0.1).tolist()  # weights 1, 0.5, 0.1 over 1.6
    [0.625, 0.3125, 0.0625]
    """
    if not 0.0 < floor <= 1.0:
        raise ValueError(f"floor must be in (0, 1], got {floor}")
    s = torch.nan_to_num(pass_rate.double(), nan=0.0).clamp(0.0, 1.0)  # (N,)
    w = (1.0 - s).clamp(min=floor)  # (N,)
    return w / w.sum()


def curriculum_fraction(step: int, steps: int, start: float) -> float:
    """The share of the prompts, easiest first, that RL step ``step`` (1-based) draws from: ``start`` at step 1,
    growing linearly to 1.0 at step ``steps`` and staying there.

    >>> [curriculum_fraction(s, 5, 0.25) for s in (1, 3, 5, 9)]
    [0.25, 0.625, 1.0, 1.0]
    """
    if steps <= 1:
        return 1.0
    progress = min(max(step - 1, 0) / (steps - 1), 1.0)
    return start + (1.0 - start) * progress


def curriculum_probs(pass_rate: Tensor, fraction: float, min_pool: int = 1) -> Tensor:
    """(N,) -> (N,): uniform over the pool of the easiest ``ceil(fraction * N)`` prompts (at least ``min_pool``,
    at most N), the highest pass rate first; 0 outside it.

    A prompt as easy as the last one let in is let in too (the pool never splits a tie, so the result does not
    depend on the prompts' order); an unknown pass rate (NaN) ranks below every known one, so with no estimate at
    all the pool is every prompt.

    >>> curriculum_probs(torch.tensor([0.1, 0.9, 0.5, 0.9]), 0.5).tolist()  # the two 0.9s
    [0.0, 0.5, 0.0, 0.5]
    """
    n = pass_rate.numel()
    k = min(max(math.ceil(fraction * n - 1e-9), min_pool, 1), n)
    s = torch.nan_to_num(pass_rate.double(), nan=-1.0)  # (N,) unknown below every rate in [0, 1]
    threshold = torch.sort(s, descending=True).values[k - 1]
    pool = (s >= threshold).double()  # (N,)
    return pool / pool.sum()
