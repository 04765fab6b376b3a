"""Policy losses, loss aggregation and the SFT loss.

Two registries:

* ``POLICY_LOSSES``: ``fn(logp, old_logp, adv, mask, cfg) -> (loss_mat (B, T), metrics)``,
  per-token losses (0 at invalid positions) and detached scalar metrics.
* ``AGGREGATIONS``: ``fn(loss_mat, mask, max_len=None) -> scalar``, how per-token
  losses become one number.

Exact micro-batching.  Every aggregation is a ratio ``numerator / denominator``
whose two parts are *sums over sequences*, so for any split of the batch into
micro-batches::

    sum(num_i) / sum(den_i) == aggregate(full batch)

``aggregate_parts`` returns ``(num, den)`` and ``aggregation_weight`` the
``den`` alone.  A trainer computes ``total = sum(aggregation_weight(mask_i))``
first (all-reduced across ranks under data parallelism), then back-propagates
``num_i / total`` for each micro-batch; the accumulated gradient equals that of
the full-batch loss.

Aggregation conventions (fixed here, tested in ``tests/test_losses.py``):

* ``token-mean``: sum over valid tokens / number of valid tokens (DAPO eq. 12).
* ``seq-mean-token-mean``: mean over sequences of per-sequence token means
  (GRPO, DeepSeekMath eq. 3).
* ``seq-mean-token-sum``: mean over sequences of per-sequence token sums.
* ``seq-mean-token-sum-norm``: sum over valid tokens / (B * max_len), a
  constant normaliser (Dr. GRPO, Liu et al. 2025, §3.1).
* In the two ``seq-mean-*`` modes a sequence with no valid token (e.g. an
  overlong sample filtered by masking) is *excluded* from the mean, not counted
  as a zero.  ``seq-mean-token-sum-norm`` always counts all B sequences.
* An empty denominator gives a loss of 0, never NaN.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from rlft.core.ops import masked_mean, masked_sum
from rlft.registry import Registry

PolicyLossFn = Callable[[Tensor, Tensor, Tensor, Tensor, Any], tuple[Tensor, dict[str, Tensor]]]
AggregationFn = Callable[..., Tensor]
PartsFn = Callable[[Tensor, Tensor, "int | None"], tuple[Tensor, Tensor]]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
AGGREGATIONS: Registry[AggregationFn] = Registry("loss aggregation")
AGGREGATION_PARTS: Registry[PartsFn] = Registry("loss aggregation")

LOG_RATIO_CLAMP = 20.0  # |log r| bound before exp, for numerical safety only


# --------------------------------------------------------------------------- policy losses


@POLICY_LOSSES.register("clip")
def clip_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with decoupled bounds (clip-higher).

    ratio r = pi / pi_old, clipped to [1 - cfg.clip_low, 1 + cfg.clip_high];
    loss = max(-A r, -A clip(r)) per token (PPO, Schulman et al. 2017, eq. 7;
    decoupled eps_low / eps_high: DAPO, Yu et al. 2025, eq. 10).
    """
    mask = mask != 0  # (B, T)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    adv = torch.where(mask, adv, zero)  # (B, T)  junk under the mask cannot reach the gradient
    log_ratio = torch.where(mask, logp - old_logp, zero)  # (B, T)
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)  # (B, T)
    loss_unclipped = -adv * ratio  # (B, T)
    loss_clipped = -adv * clipped  # (B, T)
    loss = torch.maximum(loss_unclipped, loss_clipped)  # (B, T)  pessimistic bound
    loss = torch.where(mask, loss, torch.zeros_like(loss))  # (B, T)

    with torch.no_grad():
        took_clip = (loss_clipped > loss_unclipped).float()  # (B, T)  gradient is 0 there
        clip_high = ((adv > 0) & (ratio > 1.0 + cfg.clip_high)).float()  # (B, T)
        clip_low = ((adv < 0) & (ratio < 1.0 - cfg.clip_low)).float()  # (B, T)
        metrics = {
            "pg_clipfrac": masked_mean(took_clip, mask),
            "pg_clipfrac_high": masked_mean(clip_high, mask),
            "pg_clipfrac_low": masked_mean(clip_low, mask),
            "ppo_kl": masked_mean((old_logp - logp).float(), mask),  # k1 estimate of KL(pi_old || pi)
        }
    return loss, metrics


# --------------------------------------------------------------------------- aggregation


def _denominator_safe(num: Tensor, den: Tensor) -> Tensor:
    return num / torch.where(den > 0, den, torch.ones_like(den))  # den 0 -> num 0 -> 0


def _aggregation(name: str) -> Callable[[PartsFn], PartsFn]:
    """Register a ``parts`` function under ``name`` and its ratio in ``AGGREGATIONS``."""

    def deco(parts: PartsFn) -> PartsFn:
        def agg(loss_mat: Tensor, mask: Tensor, max_len: int | None = None) -> Tensor:
            return _denominator_safe(*parts(loss_mat, mask, max_len))

        agg.__name__ = agg.__qualname__ = name.replace("-", "_")
        agg.__doc__ = parts.__doc__
        AGGREGATION_PARTS.register(name)(parts)
        AGGREGATIONS.register(name)(agg)
        return parts

    return deco


def _seq_counts(loss_mat: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sequence (token sum (B,), valid-token count (B,), has-a-valid-token (B,))."""
    seq_sum = masked_sum(loss_mat, mask, dim=-1)  # (B,)
    n_tok = (mask != 0).sum(-1).to(seq_sum.dtype)  # (B,)
    return seq_sum, n_tok, n_tok > 0


@_aggregation("token-mean")
def token_mean_parts(loss_mat: Tensor, mask: Tensor, max_len: int | None = None) -> tuple[Tensor, Tensor]:
    """sum of valid token losses / number of valid tokens (DAPO eq. 12)."""
    num = masked_sum(loss_mat, mask)  # ()
    return num, (mask != 0).sum().to(num.dtype)


@_aggregation("seq-mean-token-mean")
def seq_mean_token_mean_parts(loss_mat: Tensor, mask: Tensor, max_len: int | None = None) -> tuple[Tensor, Tensor]:
    """mean over non-empty sequences of the per-sequence token mean (DeepSeekMath eq. 3)."""
    seq_sum, n_tok, nonempty = _seq_counts(loss_mat, mask)  # (B,) each
    seq_mean = seq_sum / n_tok.clamp(min=1)  # (B,)
    return masked_sum(seq_mean, nonempty), nonempty.sum().to(seq_sum.dtype)


@_aggregation("seq-mean-token-sum")
def seq_mean_token_sum_parts(loss_mat: Tensor, mask: Tensor, max_len: int | None = None) -> tuple[Tensor, Tensor]:
    """mean over non-empty sequences of the per-sequence token sum."""
    seq_sum, _, nonempty = _seq_counts(loss_mat, mask)  # (B,) each
    return masked_sum(seq_sum, nonempty), nonempty.sum().to(seq_sum.dtype)


@_aggregation("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm_parts(loss_mat: Tensor, mask: Tensor, max_len: int | None = None) -> tuple[Tensor, Tensor]:
    """sum of valid token losses / (B * max_len) (Dr. GRPO, Liu et al. 2025, §3.1)."""
    if max_len is None:
        raise ValueError("loss aggregation 'seq-mean-token-sum-norm' needs max_len (the generation budget)")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    num = masked_sum(loss_mat, mask)  # ()
    return num, torch.tensor(float(loss_mat.shape[0] * max_len), dtype=num.dtype, device=num.device)


def aggregate(loss_mat: Tensor, mask: Tensor, mode: str, max_len: int | None = None) -> Tensor:
    """Reduce per-token losses (B, T) to a scalar with the aggregation ``mode``."""
    return AGGREGATIONS.get(mode)(loss_mat, mask, max_len)


def aggregate_parts(loss_mat: Tensor, mask: Tensor, mode: str, max_len: int | None = None) -> tuple[Tensor, Tensor]:
    """(numerator, denominator) of ``aggregate``; both add up across micro-batches."""
    return AGGREGATION_PARTS.get(mode)(loss_mat, mask, max_len)


def aggregation_weight(mask: Tensor, mode: str, max_len: int | None = None) -> Tensor:
    """The denominator a micro-batch with this ``mask`` contributes (float scalar)."""
    zeros = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)  # (B, T)
    return aggregate_parts(zeros, mask, mode, max_len)[1]


# --------------------------------------------------------------------------- supervised


def sft_loss(logp: Tensor, mask: Tensor) -> Tensor:
    """Token-mean negative log-likelihood over valid tokens."""
    return masked_mean(-logp, mask)  # ()
