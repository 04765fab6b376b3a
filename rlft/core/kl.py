"""Per-token estimators of KL(pi || ref) from samples drawn from pi.

Every estimator: ``fn(logp, ref_logp) -> (B, T)`` where ``logp = log pi(x)`` and
``ref_logp = log ref(x)`` at the sampled tokens.  With r = ref(x) / pi(x):

* ``k1 = -log r``                 unbiased, high variance, can be negative
* ``k2 = (log r)^2 / 2``          biased, low variance, >= 0
* ``k3 = (r - 1) - log r``        unbiased, low variance, >= 0
* ``abs = |log r|``               biased, >= 0

Reference: J. Schulman, "Approximating KL Divergence" (2020),
http://joschu.net/blog/kl-approx.html.  k3 is the estimator GRPO puts in its
loss (DeepSeekMath eq. 4).  Callers reduce with the loss mask.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from rlft.registry import Registry

KLFn = Callable[[Tensor, Tensor], Tensor]
KL_ESTIMATORS: Registry[KLFn] = Registry("kl estimator")

LOG_RATIO_CLAMP = 20.0  # |log r| bound before exp in k3, for numerical safety only


@KL_ESTIMATORS.register("k1")
def k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """log pi - log ref (Schulman 2020, k1)."""
    return logp - ref_logp  # (B, T)


@KL_ESTIMATORS.register("k2")
def k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """(log pi - log ref)^2 / 2 (Schulman 2020, k2)."""
    return 0.5 * (logp - ref_logp) ** 2  # (B, T)


@KL_ESTIMATORS.register("k3")
def k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """exp(log r) - log r - 1 with log r = log ref - log pi (Schulman 2020, k3; DeepSeekMath eq. 4)."""
    log_r = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)
    return torch.exp(log_r) - log_r - 1.0  # (B, T)  >= 0 since e^x >= 1 + x


@KL_ESTIMATORS.register("abs")
def abs_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """|log pi - log ref|."""
    return (logp - ref_logp).abs()  # (B, T)
