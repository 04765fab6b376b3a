"""Reward shaping and sample filtering from DAPO (Yu et al. 2025).

* ``soft_overlong_penalty``: a length-aware reward term for responses that run
  into the generation budget (DAPO eq. 13), added to the task reward.
* ``overlong_filter``: drop every token of a truncated response from the loss
  (DAPO §3.4, overlong filtering), so a cut-off answer is not punished for
  reasoning that was merely unfinished.
* ``informative_groups``: keep only groups whose rewards differ (DAPO eq. 11,
  dynamic sampling); a zero-variance group has advantage 0 everywhere and
  only dilutes the batch.  Groups are contiguous, ``scores.view(P, G)``, and a
  filter keeps or drops whole groups.

Conventions (fixed here, tested in ``tests/test_shaping.py``): the penalty is
continuous, 0 at |y| = L_max - L_cache and -factor at |y| = L_max; NaN scores
are unscorable and do not count towards a group's variety, so a group with
fewer than 2 valid scores is not informative.
"""

from __future__ import annotations

import torch
from torch import Tensor


def soft_overlong_penalty(lengths: Tensor, max_len: int, cache_len: int, factor: float = 1.0) -> Tensor:
    """Soft overlong punishment (DAPO eq. 13), (B,) int lengths -> (B,) float32, times ``factor``.

    |y| <= L_max - L_cache:               0
    L_max - L_cache < |y| <= L_max:       ((L_max - L_cache) - |y|) / L_cache
    |y| > L_max:                          -1
    """
    if max_len < 1:
        raise ValueError(f"overlong max_len must be >= 1, got {max_len}")
    if not 1 <= cache_len <= max_len:
        raise ValueError(f"overlong cache_len must be in [1, max_len={max_len}], got {cache_len}")
    if factor < 0:
        raise ValueError(f"overlong penalty factor must be >= 0, got {factor}")
    y = lengths.to(torch.float32)  # (B,)
    safe = float(max_len - cache_len)
    ramp = (safe - y) / cache_len  # (B,)  DAPO eq. 13, middle case
    penalty = torch.where(y <= safe, torch.zeros_like(y), torch.where(y <= max_len, ramp, -torch.ones_like(y)))  # (B,)
    return penalty * factor  # (B,)


def overlong_filter(mask: Tensor, truncated: Tensor) -> Tensor:
    """``mask`` (B, T) with every token of a ``truncated`` (B,) sample set to 0 (DAPO §3.4)."""
    drop = truncated.bool()[:, None]  # (B, 1)
    return torch.where(drop, torch.zeros_like(mask), mask)  # (B, T)


def informative_groups(scores: Tensor, group_size: int) -> Tensor:
    """(B,) scores -> (P,) bool: True where a group's valid (non-NaN) scores are not all equal.

    DAPO eq. 11 keeps groups with 0 < #correct < G; for any reward this is
    "at least two valid scores that differ".  Such a group never has zero variance.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if scores.numel() % group_size != 0:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size}")
    s = scores.reshape(-1, group_size).double()  # (P, G)  exact for float32 and int scores
    valid = ~torch.isnan(s)  # (P, G)
    hi = torch.where(valid, s, torch.full_like(s, -torch.inf)).amax(dim=1)  # (P,)
    lo = torch.where(valid, s, torch.full_like(s, torch.inf)).amin(dim=1)  # (P,)
    return hi > lo  # (P,)  False for < 2 valid scores: hi = lo, or hi = -inf < lo = inf
