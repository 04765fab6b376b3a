"""Outcome-level advantage estimators over groups of samples.

Every registered estimator has one signature::

    fn(scores: Tensor, group_size: int, eps: float = 1e-6) -> Tensor   # (B,) -> (B,)

``scores`` holds one scalar reward per sequence, B = P * G, groups contiguous
(``scores.view(P, G)``).  The trainer broadcasts the result over tokens.

Conventions (fixed here, tested in ``tests/test_advantages.py``):

* **NaN = unscorable.**  A NaN score is excluded from its group's statistics
  (mean, std, leave-one-out baseline) and gets advantage exactly 0.
* **Std is the unbiased sample std (Bessel, divide by n - 1)** over the valid
  samples of a group, as ``torch.std`` does by default.  So GRPO on
  ``[1, 0, 0, 1]`` gives ``±0.5 / 0.5774 = ±0.866`` (the biased std would
  give ±1).
* **Degenerate groups give 0.**  A group whose valid rewards are all equal
  (``zero_std``; this includes groups with fewer than 2 valid samples) gets
  advantage exactly 0 from every estimator, not a rounding residue.
* ``eps`` is added to the std (``(r - mean) / (std + eps)``); estimators that
  do not divide by a std (``group_mean``, ``rloo``) accept it only so that all
  estimators share one signature.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from rlft.registry import Registry

AdvantageFn = Callable[..., Tensor]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def _groups(scores: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """(B,) scores -> (P, G) rewards with NaN -> 0, and the (P, G) valid mask."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D (B,), got shape {tuple(scores.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if scores.numel() % group_size != 0:
        raise ValueError(
            f"batch size B={scores.numel()} is not divisible by group_size G={group_size}; "
            "groups must be contiguous and complete (B = P * G)"
        )
    r = scores if scores.is_floating_point() else scores.float()
    r = r.reshape(-1, group_size)  # (P, G)
    valid = ~torch.isnan(r)  # (P, G)
    return torch.where(valid, r, torch.zeros_like(r)), valid


def _stats(r: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-group count, mean, unbiased std, zero_std of the valid entries of (P, G) r."""
    n = valid.sum(-1)  # (P,)
    nf = n.to(r.dtype)
    mean = r.sum(-1) / nf.clamp(min=1)  # (P,)  NaNs were zeroed by _groups
    dev2 = torch.where(valid, (r - mean[:, None]) ** 2, torch.zeros_like(r))  # (P, G)
    std = torch.sqrt(dev2.sum(-1) / (nf - 1).clamp(min=1))  # (P,)  Bessel: / (n - 1)
    std = torch.where(n >= 2, std, torch.zeros_like(std))
    hi = torch.where(valid, r, torch.full_like(r, -torch.inf)).amax(-1)  # (P,)
    lo = torch.where(valid, r, torch.full_like(r, torch.inf)).amin(-1)  # (P,)
    zero_std = (n < 2) | (hi == lo)  # (P,)  exact equality, not std < tol
    return n, mean, std, zero_std


def group_stats(scores: Tensor, group_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group (mean (P,), unbiased std (P,), zero_std (P,) bool) over valid scores.

    Groups with no valid score have mean 0; fewer than 2, std 0.  ``zero_std``
    is True when all valid rewards of a group are equal (including groups with
    fewer than 2 valid), which feeds the metric ``frac_reward_zero_std``.
    """
    r, valid = _groups(scores, group_size)
    _, mean, std, zero_std = _stats(r, valid)
    return mean, std, zero_std


def _finish(adv: Tensor, valid: Tensor, zero_std: Tensor) -> Tensor:
    """Zero invalid samples and degenerate groups; (P, G) -> (B,)."""
    keep = valid & ~zero_std[:, None]  # (P, G)
    return torch.where(keep, adv, torch.zeros_like(adv)).reshape(-1)  # (B,)


@ADVANTAGES.register("group_norm")
def group_norm(scores: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """GRPO: A_i = (r_i - mean(r)) / (std(r) + eps) within the group (unbiased std)."""
    r, valid = _groups(scores, group_size)  # (P, G)
    _, mean, std, zero_std = _stats(r, valid)
    adv = (r - mean[:, None]) / (std[:, None] + eps)  # DeepSeekMath (Shao et al. 2024) §4.1.2, outcome supervision
    return _finish(adv, valid, zero_std)  # (B,)


@ADVANTAGES.register("group_mean")
def group_mean(scores: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """Dr. GRPO: A_i = r_i - mean(r), no std division (``eps`` unused)."""
    r, valid = _groups(scores, group_size)  # (P, G)
    _, mean, _, zero_std = _stats(r, valid)
    adv = r - mean[:, None]  # Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training") eq. 3
    return _finish(adv, valid, zero_std)  # (B,)


@ADVANTAGES.register("rloo")
def rloo(scores: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """RLOO: A_i = r_i - mean_{j != i} r_j over valid samples (``eps`` unused)."""
    r, valid = _groups(scores, group_size)  # (P, G)
    n, _, _, zero_std = _stats(r, valid)
    nf = n.to(r.dtype)[:, None]  # (P, 1)
    baseline = (r.sum(-1, keepdim=True) - r) / (nf - 1).clamp(min=1)  # (P, G) leave-one-out mean
    adv = r - baseline  # Ahmadian et al. 2024 ("Back to basics"), RLOO estimator; Kool et al. 2019
    return _finish(adv, valid, zero_std)  # (B,)
