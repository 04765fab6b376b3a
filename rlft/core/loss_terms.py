"""Pieces every policy loss shares: masking of the inputs, the metric dict, the log-ratio clamp.

Kept apart from ``rlft.core.losses`` (the registries) so that the loss modules it registers,
``rlft.core.trust_region`` among them, can use them without an import circle.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlft.core.ops import masked_mean

LOG_RATIO_CLAMP = 20.0  # |log r| bound before exp, for numerical safety only


def _metrics(logp: Tensor, old_logp: Tensor, valid: Tensor, **flags: Tensor) -> dict[str, Tensor]:
    """Token fractions of the bool (B, T) ``flags`` over valid tokens, and ppo_kl; all detached."""
    with torch.no_grad():
        out = {f"pg_{k}": masked_mean(v.float(), valid) for k, v in flags.items()}
        out["ppo_kl"] = masked_mean((old_logp - logp).float(), valid)  # k1 estimate of KL(pi_old || pi)
    return out


def _masked_inputs(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(valid (B, T) bool, adv with invalid -> 0, log ratio with invalid -> 0): junk cannot reach the gradient."""
    valid = mask != 0  # (B, T)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    adv = torch.where(valid, adv, zero)  # (B, T)
    log_ratio = torch.where(valid, logp - old_logp, zero)  # (B, T)
    return valid, adv, log_ratio


def _no_clip_flags(valid: Tensor) -> dict[str, Tensor]:
    never = torch.zeros_like(valid)  # (B, T) bool
    return {"clipfrac": never, "clipfrac_high": never, "clipfrac_low": never, "clipfrac_dual": never}


def _check_clip_c(clip_c: float) -> None:
    if clip_c != 0 and not clip_c > 1:
        raise ValueError(f"clip_c (dual-clip constant) must be 0 (off) or > 1, got {clip_c}")


def _surrogate(ratio: Tensor, adv: Tensor, valid: Tensor, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate of ``ratio`` (B, T), shared by ``clip`` and ``gspo``; adv is 0 at invalid.

    loss = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))      (PPO eq. 7, DAPO eq. 10)
    and, when cfg.clip_c > 0, for A < 0: loss = min(that, -clip_c A)
    (dual-clip PPO, Ye et al. 2020, arXiv:1912.09729)
    """
    clip_c = float(cfg.clip_c)
    _check_clip_c(clip_c)
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)  # (B, T)
    loss_unclipped = -adv * ratio  # (B, T)
    loss_clipped = -adv * clipped  # (B, T)
    loss = torch.maximum(loss_unclipped, loss_clipped)  # (B, T)  pessimistic bound
    dual = torch.zeros_like(valid)  # (B, T) bool
    if clip_c > 0:
        cap = -clip_c * adv  # (B, T)  > 0 where A < 0
        dual = valid & (adv < 0) & (loss > cap)  # (B, T)  capped: gradient 0 there
        loss = torch.where(dual, cap, loss)  # (B, T)
    loss = torch.where(valid, loss, torch.zeros_like(loss))  # (B, T)
    with torch.no_grad():
        flags = {
            "clipfrac": loss_clipped > loss_unclipped,  # (B, T)  the PPO clip is active, gradient 0
            "clipfrac_high": (adv > 0) & (ratio > 1.0 + cfg.clip_high),  # (B, T)
            "clipfrac_low": (adv < 0) & (ratio < 1.0 - cfg.clip_low),  # (B, T)
            "clipfrac_dual": dual,  # (B, T)
        }
    return loss, flags
