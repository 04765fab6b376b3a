"""Losses on preferences: Bradley-Terry reward modelling, DPO and IPO, and the pairs of a K-way ranking.

All are pure functions of per-example tensors (B,) and return per-example
losses (B,); the caller averages. Conventions fixed here:

- Bradley-Terry (InstructGPT eq. 1): ``-log sigma(r_chosen - r_rejected - margin)``;
  the optional margin is Llama 2's (Touvron et al. 2023, eq. 2).
- Reward centring (Eisenstein et al. 2023, as in TRL): ``coef * (r_chosen + r_rejected)^2``,
  pulling the reward's mean to zero without changing the ranking.
- DPO (Rafailov et al. 2023, eq. 7): ``-log sigma(beta * h)`` with
  ``h = (logp_c - ref_c) - (logp_r - ref_r)``; IPO (Azar et al. 2023, eq. 17):
  ``(h - 1 / (2 beta))^2``. The implicit rewards are ``beta * (logp - ref)``.
"""

from __future__ import annotations

from itertools import combinations

import torch.nn.functional as F
from torch import Tensor


def bradley_terry_loss(r_chosen: Tensor, r_rejected: Tensor, margin: Tensor | float = 0.0) -> Tensor:
    """``-log sigma(r_c - r_r - margin)`` per pair (B,); softplus form, stable for large differences."""
    return F.softplus(-(r_chosen - r_rejected - margin))  # (B,) == -logsigmoid(x), InstructGPT eq. 1


def reward_centering(r_chosen: Tensor, r_rejected: Tensor, coef: float) -> Tensor:
    """``coef * (r_c + r_r)^2`` per pair (B,): keeps the reward model's output centred on zero."""
    return coef * (r_chosen + r_rejected) ** 2  # (B,)


def ranking_pairs(k: int) -> list[tuple[int, int]]:
    """The C(k, 2) (winner, loser) index pairs of a ranking listed best first (InstructGPT §3.5).

    >>> ranking_pairs(3)
    [(0, 1), (0, 2), (1, 2)]
    """
    if k < 2:
        raise ValueError(f"a ranking needs at least 2 responses, got {k}")
    return list(combinations(range(k), 2))


def preference_margin(logp_chosen: Tensor, logp_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor) -> Tensor:
    """``h = (logp_c - ref_c) - (logp_r - ref_r)`` per pair (B,): the log-ratio margin DPO and IPO act on."""
    return (logp_chosen - ref_chosen) - (logp_rejected - ref_rejected)  # (B,)


def dpo_loss(logp_chosen: Tensor, logp_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor,
             beta: float) -> Tensor:
    """``-log sigma(beta * h)`` per pair (B,) (DPO eq. 7); inputs are sequence log-probs (B,)."""
    h = preference_margin(logp_chosen, logp_rejected, ref_chosen, ref_rejected)  # (B,)
    return F.softplus(-beta * h)  # (B,)


def ipo_loss(logp_chosen: Tensor, logp_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor,
             beta: float) -> Tensor:
    """``(h - 1 / (2 beta))^2`` per pair (B,) (IPO, Azar et al. 2023, eq. 17; beta is their tau)."""
    h = preference_margin(logp_chosen, logp_rejected, ref_chosen, ref_rejected)  # (B,)
    return (h - 1.0 / (2.0 * beta)) ** 2  # (B,)


def implicit_rewards(logp: Tensor, ref_logp: Tensor, beta: float) -> Tensor:
    """DPO's implicit reward ``beta * (logp - ref)`` per sequence (B,) (DPO eq. 5, up to the partition term)."""
    return beta * (logp - ref_logp)  # (B,)


def chosen_nll(logp_chosen: Tensor, chosen_tokens: Tensor) -> Tensor:
    """Length-normalised NLL of the chosen response per pair (B,): ``-logp_chosen / |chosen|``, the term
    Iterative RPO (Pang et al. 2024, eq. 1) adds to DPO so the chosen likelihood does not fall with the rejected's."""
    return -logp_chosen / chosen_tokens.to(logp_chosen.dtype).clamp(min=1)  # (B,)
