"""Critic loss and its diagnostic, for value-based algorithms (PPO, VAPO).

Conventions (fixed here, tested in ``tests/test_value.py``):

* **The 0.5 factor.**  ``value_loss`` is 0.5 * squared error, as in verl and
  OpenRLHF, so its gradient w.r.t. V is (V - R); the critic's learning rate and
  ``vf_coef`` are tuned against that scale.
* **Value clipping** comes from OpenAI baselines' PPO2 and is kept by verl and
  OpenRLHF; the PPO paper itself uses the plain L^VF = (V - V_targ)^2 (Schulman
  et al. 2017, eq. 9).  The prediction may move at most ``clip`` from the
  rollout-time value ``old_values`` before its error stops shrinking, and the
  loss is the pessimistic max of the clipped and unclipped errors.
  ``clip = 0`` turns clipping off.
* ``explained_variance`` is 1 - Var(R - V) / Var(R) over valid tokens (biased
  variances; the ratio is the same with Bessel's correction).  When the
  returns have zero variance (including < 2 valid tokens) there is nothing to
  explain and it is **0.0**, finite, never NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlft.core.ops import masked_mean, masked_var


def value_loss(values: Tensor, old_values: Tensor, ret: Tensor, mask: Tensor,
               clip: float) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token critic loss (B, T), 0 at invalid tokens, and ``{"vf_clipfrac": scalar}``.

    clip > 0:  0.5 * max((V - R)^2, (V_old + clamp(V - V_old, -clip, clip) - R)^2)
    clip = 0:  0.5 * (V - R)^2
    ``vf_clipfrac`` is the fraction of valid tokens where the clipped error is
    the larger one (the gradient is 0 there).
    """
    if clip < 0:
        raise ValueError(f"value clip range must be >= 0 (0: no clipping), got {clip}")
    valid = mask != 0  # (B, T)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    values = torch.where(valid, values, zero)  # (B, T)  junk under the mask cannot reach the gradient
    old_values = torch.where(valid, old_values, zero)  # (B, T)
    ret = torch.where(valid, ret, zero)  # (B, T)
    err = (values - ret) ** 2  # (B, T)
    clipped_more = torch.zeros_like(valid)  # (B, T) bool
    if clip > 0:
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)  # (B, T)
        err_clipped = (v_clipped - ret) ** 2  # (B, T)
        clipped_more = err_clipped > err  # (B, T)
        err = torch.maximum(err, err_clipped)  # (B, T)  pessimistic bound
    loss = torch.where(valid, 0.5 * err, torch.zeros_like(err))  # (B, T)
    with torch.no_grad():
        metrics = {"vf_clipfrac": masked_mean(clipped_more.float(), valid)}
    return loss, metrics


@torch.no_grad()
def explained_variance(values: Tensor, ret: Tensor, mask: Tensor) -> Tensor:
    """1 - Var(R - V) / Var(R) over valid tokens, a detached scalar; 0.0 if Var(R) = 0.

    1 is a perfect critic, 0 one no better than predicting the mean return,
    negative one worse than that.
    """
    valid = mask != 0  # (B, T)
    var_ret = masked_var(ret, valid, unbiased=False)  # ()
    var_err = masked_var(ret - values, valid, unbiased=False)  # ()
    safe = torch.where(var_ret > 0, var_ret, torch.ones_like(var_ret))  # ()
    return torch.where(var_ret > 0, 1.0 - var_err / safe, torch.zeros_like(var_ret))  # ()
