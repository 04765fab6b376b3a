"""Policy losses, loss aggregation, the SFT loss and VAPO's positive-sample LM loss.

Two registries:

* ``POLICY_LOSSES``: ``fn(logp, old_logp, adv, mask, cfg) -> (loss_mat (B, T), metrics)``,
  per-token losses (0 at invalid positions) and detached scalar metrics.
  ``clip`` (PPO / DAPO clip-higher, optional dual-clip), ``gspo`` (sequence
  ratio), ``reinforce`` (plain -A logp).  ``cfg`` needs ``clip_low``,
  ``clip_high`` and ``clip_c`` (0 = no dual-clip, otherwise > 1).  Every loss
  returns the same metric keys, fractions of valid tokens:
  ``pg_clipfrac`` (the PPO clip is active, gradient 0), ``pg_clipfrac_high``
  (A > 0 and r > 1 + clip_high), ``pg_clipfrac_low`` (A < 0 and
  r < 1 - clip_low), ``pg_clipfrac_dual`` (the dual-clip cap is active), and
  ``ppo_kl`` (mean of old_logp - logp, k1 of KL(pi_old || pi)); a loss may add
  its own keys (``ppo_penalty`` adds ``ppo_penalty_kl``).
  ``ppo_penalty`` (PPO's KL-penalty objective, reads ``cfg.penalty_coef``) and
  ``kimi_omd`` (Kimi k1.5 online mirror descent, reads ``cfg.omd_tau``) complete
  the table; ``cfg`` is the algo config *as it holds at this step* (the trainer
  passes a ``dataclasses.replace`` copy carrying the adaptive beta).  The 2025
  losses live in ``rlft.core.trust_region`` and are registered here: ``cispo``,
  ``sapo``, ``gmpo``, ``dppo_tv``, ``dppo_kl``, ``clip_cov``, ``kl_cov``.
* ``AGGREGATIONS``: ``fn(loss_mat, mask, max_len=None) -> scalar``, how per-token
  losses become one number.

Exact micro-batching.  Every aggregation is a ratio ``numerator / denominator``
whose numerator is a *sum over sequences*, and whose denominator depends on the
mask alone.  ``aggregate_parts`` returns ``(num, den)`` and ``aggregation_weight``
the ``den`` alone.  A trainer computes ``total = aggregation_weight(mask)`` of the
whole mini-batch first (``rlft.trainers.update`` does, on the mini-batch's rows of
every process), then back-propagates ``num_i / total`` for each micro-batch; the
accumulated gradient equals that of the full-batch loss.  For every mode but
``token-sum`` the denominator is also a sum over sequences, so
``sum(num_i) / sum(den_i) == aggregate(full batch)``; ``token-sum``'s is the
constant 1.

Aggregation conventions (fixed here, tested in ``tests/test_losses.py``):

* ``token-mean``: sum over valid tokens / number of valid tokens (DAPO eq. 12).
* ``seq-mean-token-mean``: mean over sequences of per-sequence token means
  (GRPO, DeepSeekMath eq. 3).
* ``seq-mean-token-sum``: mean over sequences of per-sequence token sums.
* ``token-sum``: sum over valid tokens, no normaliser (a loss that grows with
  the batch and the lengths: scale the learning rate to it).
* ``seq-mean-token-sum-norm``: sum over valid tokens / (B * max_len), a
  constant normaliser (Dr. GRPO, Liu et al. 2025, §3.1).
* In the two ``seq-mean-*`` modes a sequence with no valid token (e.g. an
  overlong sample filtered by masking) is *excluded* from the mean, not counted
  as a zero.  ``seq-mean-token-sum-norm`` always counts all B sequences.
* An empty denominator gives a loss of 0, never NaN.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from rlft.core.loss_terms import LOG_RATIO_CLAMP, _masked_inputs, _metrics, _no_clip_flags, _surrogate
from rlft.core.trust_region import (
    cispo_loss, clip_cov_loss, dppo_kl_loss, dppo_tv_loss, gmpo_loss, kl_cov_loss, sapo_loss,
)
from rlft.core.ops import masked_mean, masked_sum
from rlft.registry import Registry

PolicyLossFn = Callable[[Tensor, Tensor, Tensor, Tensor, Any], tuple[Tensor, dict[str, Tensor]]]
AggregationFn = Callable[..., Tensor]
PartsFn = Callable[[Tensor, Tensor, "int | None"], tuple[Tensor, Tensor]]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
AGGREGATIONS: Registry[AggregationFn] = Registry("loss aggregation")
AGGREGATION_PARTS: Registry[PartsFn] = Registry("loss aggregation")



# --------------------------------------------------------------------------- policy losses


@POLICY_LOSSES.register("clip")
def clip_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with decoupled bounds (clip-higher) and optional dual-clip.

    ratio r = pi / pi_old, clipped to [1 - cfg.clip_low, 1 + cfg.clip_high];
    loss = max(-A r, -A clip(r)) per token (PPO, Schulman et al. 2017, eq. 7;
    decoupled eps_low / eps_high: DAPO, Yu et al. 2025, eq. 10).  With
    cfg.clip_c > 0 (must be > 1) the loss of a token with A < 0 is capped at
    -clip_c * A (dual-clip PPO, Ye et al. 2020, arXiv:1912.09729), so a huge ratio on a
    bad token cannot blow up the update.
    """
    valid, adv, log_ratio = _masked_inputs(logp, old_logp, adv, mask)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (B, T)
    loss, flags = _surrogate(ratio, adv, valid, cfg)
    return loss, _metrics(logp, old_logp, valid, **flags)


@POLICY_LOSSES.register("gspo")
def gspo_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: clipping on the length-normalised sequence ratio (Zheng et al. 2025).

    s_i = exp(mean_t (logp - old_logp)) over the valid tokens of sequence i
    (GSPO eq. 7), clipped to [1 - cfg.clip_low, 1 + cfg.clip_high] at the
    sequence level (eq. 5).  The per-token matrix uses the GSPO-token form
    (eq. 13-14): log s_i,t = sg[log s_i] + logp_t - sg[logp_t], whose value is
    s_i at every token and whose gradient w.r.t. logp_t is s_i.  Aggregated with
    ``seq-mean-token-mean`` and sequence-constant advantages, value and gradient
    equal those of the sequence-level objective -mean_i min(s_i A_i, clip(s_i) A_i).
    Dual-clip (cfg.clip_c) applies to s_i as in ``clip``.  Clip fractions are
    fractions of valid tokens (a clipped sequence counts with its length).
    """
    valid, adv, log_ratio = _masked_inputs(logp, old_logp, adv, mask)
    seq_log_ratio = masked_mean(log_ratio, valid, dim=-1)  # (B,)  log s_i, GSPO eq. 7 (0 for an empty row)
    seq_log_ratio = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).detach()  # (B,)  sg[log s_i]
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    token_part = torch.where(valid, logp - logp.detach(), zero)  # (B, T)  value 0, d/dlogp_t = 1
    ratio = torch.exp(seq_log_ratio[:, None] + token_part)  # (B, T)  s_i,t, GSPO eq. 14
    loss, flags = _surrogate(ratio, adv, valid, cfg)
    return loss, _metrics(logp, old_logp, valid, **flags)


@POLICY_LOSSES.register("reinforce")
def reinforce_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor,
                   cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """Plain policy gradient: loss = -A * logp (REINFORCE, Williams 1992; no ratio, no clipping).

    Clip fractions are 0; ppo_kl is reported as in ``clip``.
    """
    valid = mask != 0  # (B, T)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    adv = torch.where(valid, adv, zero)  # (B, T)
    loss = -adv * torch.where(valid, logp, zero)  # (B, T)  0 at invalid
    return loss, _metrics(logp, old_logp, valid, **_no_clip_flags(valid))


@POLICY_LOSSES.register("ppo_penalty")
def ppo_penalty_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor,
                     cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO with a KL penalty instead of clipping (Schulman et al. 2017, §4, eq. 8).

    loss_t = -r_t A_t + beta * kl_t, r_t = pi / pi_old, beta = cfg.penalty_coef, and
    kl_t = (r_t - 1) - log r_t: Schulman's k3 estimate of KL(pi_old || pi) from the
    tokens, which were sampled from pi_old (``rlft.core.kl.k3(old_logp, logp)``).
    It is unbiased in value (E_old[r] = 1) and in gradient
    (E_old[(r - 1) grad log pi] = -E_old[grad log pi] = grad KL(pi_old || pi)),
    >= 0, and its gradient vanishes at r = 1, so the penalty acts only once pi moved.
    Extra metric ``ppo_penalty_kl``: the mean kl_t at this step's forward pass (the
    d of PPO §4 that ``PenaltyCoefController`` steers is the same estimate taken after
    the update, ``rlft.trainers.rl.penalty_kl``).  No clipping: clip fractions are 0.
    """
    valid, adv, log_ratio = _masked_inputs(logp, old_logp, adv, mask)
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)  0 at invalid
    ratio = torch.exp(log_ratio)  # (B, T)
    kl = ratio - 1.0 - log_ratio  # (B, T)  k3 of KL(pi_old || pi); 0 at invalid
    loss = -adv * ratio + cfg.penalty_coef * kl  # (B, T)  PPO eq. 8
    loss = torch.where(valid, loss, torch.zeros_like(loss))  # (B, T)
    metrics = _metrics(logp, old_logp, valid, **_no_clip_flags(valid))
    metrics["ppo_penalty_kl"] = masked_mean(kl.detach(), valid)
    return loss, metrics


@POLICY_LOSSES.register("kimi_omd")
def kimi_omd_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor,
                  cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """Online mirror descent of Kimi k1.5 (Kimi Team 2025, §2.3.2).

    Per sequence j with log pi(y_j) = sum_t logp_t and L_j = sum_t (logp_t - old_logp_t)
    over its valid tokens, the objective's gradient is
    (1/k) sum_j [grad log pi(y_j) (r_j - rbar) - (tau/2) grad L_j^2], i.e. the loss
    -(r_j - rbar) log pi(y_j) + (tau/2) L_j^2 per sequence, tau = cfg.omd_tau.
    Per token: -A_t logp_t + (tau/2) L_j^2 / n_j with n_j the valid tokens of j, so
    a sequence's token sum is exactly its loss.  Intended pairing: advantage
    ``group_mean`` (A_t = r_j - rbar, the mean of the k samples) and aggregation
    ``seq-mean-token-sum`` (the 1/k mean over sequences).  With a single update per
    batch L_j = 0 and this is REINFORCE with the group-mean baseline; tau acts once
    several steps share a batch (algo.epochs or algo.minibatches > 1).
    """
    valid, adv, log_ratio = _masked_inputs(logp, old_logp, adv, mask)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    seq_log_ratio = log_ratio.sum(-1)  # (B,)  L_j = log pi(y_j) / pi_old(y_j)
    n_tok = valid.sum(-1).clamp(min=1).to(logp.dtype)  # (B,)
    penalty = 0.5 * cfg.omd_tau * seq_log_ratio ** 2 / n_tok  # (B,)  (tau/2) L_j^2 spread over n_j tokens
    loss = -adv * torch.where(valid, logp, zero) + penalty[:, None]  # (B, T)
    loss = torch.where(valid, loss, torch.zeros_like(loss))  # (B, T)
    return loss, _metrics(logp, old_logp, valid, **_no_clip_flags(valid))


for _name, _fn in (("cispo", cispo_loss), ("sapo", sapo_loss), ("gmpo", gmpo_loss), ("dppo_tv", dppo_tv_loss),
                   ("dppo_kl", dppo_kl_loss), ("clip_cov", clip_cov_loss), ("kl_cov", kl_cov_loss)):
    POLICY_LOSSES.register(_name)(_fn)


def top_entropy_mask(entropy: Tensor, mask: Tensor, frac: float) -> Tensor:
    """(B, T) bool: the valid tokens whose entropy is at least the k-th largest, k = ceil(frac * n_valid).

    "Beyond the 80/20 rule" (Wang et al. 2025, arXiv:2506.01939, §5): the policy gradient keeps the
    term of a token only if H_t >= tau_rho, the rho-quantile from the top of the entropies of the
    batch's tokens (rho = frac, 0.2 in the paper); the normaliser of the objective is unchanged.
    Ties at the threshold are all kept; frac = 1 keeps every valid token.  No gradient flows through it.
    """
    valid = mask != 0  # (B, T)
    n = int(valid.sum())
    if n == 0 or frac >= 1:
        return valid
    k = max(1, math.ceil(frac * n))
    ent = torch.where(valid, entropy.detach(), torch.full_like(entropy, -torch.inf))  # (B, T)
    tau = torch.topk(ent.flatten(), k).values[-1]  # the k-th largest valid entropy
    return valid & (ent >= tau)


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


@_aggregation("token-sum")
def token_sum_parts(loss_mat: Tensor, mask: Tensor, max_len: int | None = None) -> tuple[Tensor, Tensor]:
    """sum of valid token losses, no normaliser (the denominator is the constant 1, whatever the batch)."""
    num = masked_sum(loss_mat, mask)  # ()
    return num, torch.ones((), dtype=num.dtype, device=num.device)


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


def positive_lm_parts(logp: Tensor, mask: Tensor, positive: Tensor) -> tuple[Tensor, Tensor]:
    """(sum of -logp, token count) over the valid tokens of the ``positive`` (B,) samples.

    The positive-example LM loss of VAPO (Yuan et al. 2025, eq. 9) is
    ``num / den``, the NLL averaged over the tokens of the correct samples; the
    trainer scales it by mu.  Both parts add up across micro-batches, as in
    ``aggregate_parts``.
    """
    keep = (mask != 0) & positive.bool()[:, None]  # (B, T)
    num = masked_sum(-logp, keep)  # ()
    return num, keep.sum().to(num.dtype)


def positive_lm_loss(logp: Tensor, mask: Tensor, positive: Tensor) -> Tensor:
    """VAPO eq. 9 on one batch: token-mean NLL of the positive samples; 0 if there is none."""
    return _denominator_safe(*positive_lm_parts(logp, mask, positive))  # ()
