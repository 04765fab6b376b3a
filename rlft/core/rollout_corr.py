"""Rollout correction: the tokens come from a sampler mu that is not quite the trainer's pi_old.

A sampler that is not the trainer (transformers' ``generate`` under bfloat16 autocast, vLLM's kernels, any backend
with weights or arithmetic of its own) draws y ~ mu while the loss's ratio is taken against pi_old, the trainer's own
log-probs of the same tokens. The policy gradient is then an expectation under the wrong distribution; importance
weights rho = pi_old / mu, detached, move it back (Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training"; verl ``algorithm.rollout_correction``; TRL ``vllm_importance_sampling_*``).

Per token, rho_t = exp(old_logp_t - rollout_logp_t); per sequence, rho = prod_t rho_t = exp(sum_t (old_logp_t -
rollout_logp_t)) over the sequence's valid tokens, computed in log space. Log-ratios are clamped to +-20 before exp
(verl's safety bound), as the PPO ratio is (``rlft.core.losses.LOG_RATIO_CLAMP``). The modes (``CORRECTIONS``):

* ``token_tis``: w_t = min(rho_t, C)              (TIS; verl rollout_is=token; TRL token_truncate)
* ``seq_tis``:   w_t = min(rho, C) for every t   (verl rollout_is=sequence; TRL sequence_truncate)
* ``token_mis``: w_t = rho_t if low <= rho_t <= C else 0   (masked IS, two-sided as IcePop; verl's
  "lower_upper" threshold; TRL token_mask is the one-sided low = 0)
* ``seq_mis``:   w_t = rho if low <= rho <= C else 0 for every t (TRL sequence_mask, two-sided)
* ``off``:       w_t = 1

The trainer multiplies each token's policy-gradient loss by w_t (``rlft.trainers.update``); w is 0 at invalid
positions. Truncation bounds the variance at the price of a bias E_mu[(rho - C)_+ g]; masking drops the tokens or
sequences whose sampler disagrees most, at the price of the gradient those would have carried. ``seq_tis`` and
``seq_mis`` with a band that keeps every sequence are unbiased for the sequence-level objective; the token modes
correct each token's conditional, not the distribution of its prefix.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlft.config.algo import ROLLOUT_CORRECTIONS as CORRECTIONS
from rlft.core.losses import LOG_RATIO_CLAMP
from rlft.core.ops import masked_sum

AUTO_MODE = "token_tis"
"""What ``auto`` resolves to where the sampler is not exact: the original TIS, lowest variance of the modes."""


def resolve(mode: str, exact: bool) -> str:
    """The correction a run applies: ``mode``, or for ``auto`` ``off`` where the sampler is ``exact`` (it computes
    the trainer's own log-probs) and ``AUTO_MODE`` where it is not."""
    if mode == "auto":
        return "off" if exact else AUTO_MODE
    if mode not in CORRECTIONS:
        raise ValueError(f"unknown rollout correction {mode!r}; allowed: auto, {', '.join(CORRECTIONS)}")
    return mode


def log_ratios(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, level: str) -> Tensor:
    """log rho at ``level``: per token (B, T), or per sequence broadcast to its tokens (B, T); 0 at invalid and where
    the sampler gave no log-prob (NaN: ratio 1)."""
    valid = (mask != 0) & ~torch.isnan(rollout_logp)  # (B, T)
    zero = torch.zeros((), dtype=old_logp.dtype, device=old_logp.device)
    tok = torch.where(valid, old_logp - rollout_logp, zero)  # (B, T) log rho_t
    if level == "token":
        return tok
    seq = tok.sum(-1, keepdim=True)  # (B, 1) log prod_t rho_t
    return torch.where(mask != 0, seq.expand_as(tok), zero)  # (B, T)


def correction_weights(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, mode: str, cap: float,
                       low: float) -> tuple[Tensor, Tensor]:
    """(w (B, T), rejected (B, T) bool): the detached weights of ``mode`` (see the module's docstring) and the valid
    tokens a masked mode sets to 0. ``off``: w = 1 on valid tokens."""
    valid = mask != 0  # (B, T)
    never = torch.zeros_like(valid)
    if mode == "off":
        return valid.to(old_logp.dtype), never
    level = "sequence" if mode.startswith("seq") else "token"
    log_rho = log_ratios(old_logp.detach(), rollout_logp, mask, level).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho = torch.exp(log_rho) * valid  # (B, T)
    if mode.endswith("tis"):
        return rho.clamp(max=cap), never
    if mode.endswith("mis"):
        rejected = valid & ((rho < low) | (rho > cap))  # (B, T)
        return torch.where(rejected, torch.zeros_like(rho), rho), rejected
    raise ValueError(f"unknown rollout correction {mode!r}; allowed: {', '.join(CORRECTIONS)}")


def gap_stats(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, mode: str, rejected: Tensor) -> dict[str, float]:
    """Additive and max parts of the ``rollout_corr/`` metrics over ``mask``'s tokens (a token without the sampler's
    log-prob, NaN, counts with gap 0) (combine with ``gap_metrics``):
    the token count, sum and max of |old_logp - rollout_logp|, the sum of rollout_logp - old_logp (k1 of
    KL(mu || pi_old), verl's rollout_corr/kl), the rejected count, and the max raw ratio at the mode's level (per
    token for the token modes and ``off``; the sequence ratio for the ``seq_*`` modes), before truncation."""
    valid = mask != 0
    with torch.no_grad():
        diff = log_ratios(old_logp.detach().double(), rollout_logp.double(), mask, "token")  # (B, T) log rho_t
        level = "sequence" if mode.startswith("seq") else "token"
        log_rho = log_ratios(old_logp.detach().double(), rollout_logp.double(), mask, level)
        n = int(valid.sum())
        return {
            "tokens": float(n),
            "gap_sum": float(masked_sum(diff.abs(), valid)),
            "gap_max": float(diff.abs()[valid].max()) if n else 0.0,
            "kl_sum": float(masked_sum(-diff, valid)),
            "rejected": float(rejected.sum()),
            "log_ratio_max": float(log_rho[valid].max()) if n else 0.0,
        }


def gap_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """The ``rollout_corr/`` metrics from the ``gap_stats`` of micro-batches (and processes): logp_gap_mean and
    logp_gap_max (|log pi_old - log mu| per token), kl (mean log mu - log pi_old), masked_frac (tokens a masked mode
    dropped) and ratio_max (the largest raw ratio, exp clamped at +-20)."""
    n = sum(p["tokens"] for p in parts)
    full = [p for p in parts if p["tokens"]]
    if not n:
        return {}
    return {
        "rollout_corr/logp_gap_mean": sum(p["gap_sum"] for p in parts) / n,
        "rollout_corr/logp_gap_max": max(p["gap_max"] for p in full),
        "rollout_corr/kl": sum(p["kl_sum"] for p in parts) / n,
        "rollout_corr/masked_frac": sum(p["rejected"] for p in parts) / n,
        "rollout_corr/ratio_max": float(torch.tensor(max(p["log_ratio_max"] for p in full)).clamp(
            -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()),
    }
