"""Policy losses that keep the update near the old policy by other means than PPO's hard clip: CISPO, SAPO, GMPO,
DPPO (binary TV and KL), Clip-Cov and KL-Cov.

Pure functions with the ``POLICY_LOSSES`` signature ``fn(logp, old_logp, adv, mask, cfg) ->
(loss_mat (B, T), metrics)``; ``rlft.core.losses`` registers them.  Each returns the metric keys
every loss returns (``pg_clipfrac``, ``pg_clipfrac_high``, ``pg_clipfrac_low``, ``pg_clipfrac_dual``,
``ppo_kl``); what a "clip" means for each is in its docstring.  Invalid positions are selected
away before any arithmetic, as in ``rlft.core.losses``.

Clip-Cov and KL-Cov pick tokens by a statistic of *all the tokens of the call* (the covariance of
advantage and log-prob, centred on their means, and a count ``ratio * n_valid``).  The trainer
calls a loss once per micro-batch, so with several micro-batches per mini-batch the selection is
per micro-batch, as in verl (whose policy loss also runs per micro-batch); with
``train.micro_batch_size`` >= the mini-batch it is the paper's selection over the batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlft.core.loss_terms import LOG_RATIO_CLAMP, _masked_inputs, _metrics, _no_clip_flags, _surrogate
from rlft.core.ops import masked_mean


def _ratio(log_ratio: Tensor) -> Tensor:
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (B, T)


def _flags(valid: Tensor, clip: Tensor, high: Tensor, low: Tensor, dual: Tensor | None = None) -> dict[str, Tensor]:
    never = torch.zeros_like(valid)
    return {"clipfrac": valid & clip, "clipfrac_high": valid & high, "clipfrac_low": valid & low,
            "clipfrac_dual": never if dual is None else valid & dual}


def cispo_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, MiniMax 2025, arXiv:2506.13585, §3.1): clip the importance weight, keep every gradient.

    loss_t = -sg(r^_t) A_t logp_t with r^_t = clip(r_t, 1 - cfg.clip_low, 1 + cfg.clip_high)
    (the CISPO objective and its clipped IS weight, M1 eq. 4-5), so grad = -r^_t A_t grad logp_t:
    a REINFORCE gradient weighted by the clipped ratio.  No token's gradient is dropped; the paper
    sets no lower bound (a large eps_low, e.g. clip_low 1.0 gives 0) and tunes eps_high.
    The value is -r^ A logp, as in the paper and verl's ``cispo`` (it is not a surrogate of the return).
    Metrics: ``pg_clipfrac`` is the fraction of valid tokens whose weight was clipped (the gradient is
    kept, scaled), ``pg_clipfrac_high`` / ``_low`` those above / below the bounds, whatever A's sign.
    """
    valid, adv, log_ratio = _masked_inputs(logp, old_logp, adv, mask)
    ratio = _ratio(log_ratio).detach()  # (B, T)
    weight = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)  # (B, T)  r^, M1 eq. 5
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    loss = -weight * adv * torch.where(valid, logp, zero)  # (B, T)  M1 eq. 4, 0 at invalid
    high, low = ratio > 1.0 + cfg.clip_high, ratio < 1.0 - cfg.clip_low
    return loss, _metrics(logp, old_logp, valid, **_flags(valid, high | low, high, low))


def sapo_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO (Gao et al. 2025, arXiv:2511.20347): a soft sigmoid gate in place of the hard clip.

    loss_t = -f(r_t) A_t with f(r) = sigmoid(tau (r - 1)) * 4 / tau, tau = cfg.sapo_tau_pos where
    A_t > 0 and cfg.sapo_tau_neg otherwise (the SAPO objective and gate).  d f / d logp =
    4 sigma (1 - sigma) r, so on-policy (r = 1) the gradient is exactly -A grad logp, as PPO's; it
    decays smoothly as r leaves 1, faster for the larger tau.  No hard clip: clip fractions are 0.
    Extra metric ``sapo_gate``: the mean gate f(r) over valid tokens.
    """
    valid, adv, log_ratio = _masked_inputs(logp, old_logp, adv, mask)
    ratio = _ratio(log_ratio)  # (B, T)
    tau = torch.where(adv > 0, torch.as_tensor(cfg.sapo_tau_pos, dtype=ratio.dtype),
                      torch.as_tensor(cfg.sapo_tau_neg, dtype=ratio.dtype))  # (B, T)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)  # (B, T)  SAPO soft gate
    loss = torch.where(valid, -gate * adv, torch.zeros_like(gate))  # (B, T)
    metrics = _metrics(logp, old_logp, valid, **_no_clip_flags(valid))
    metrics["sapo_gate"] = masked_mean(gate.detach(), valid)
    return loss, metrics


def gmpo_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO (Zhao et al. 2025, arXiv:2507.20673): the geometric mean of clipped token ratios per sequence.

    Per token the log-ratio l_t is clipped in log space to [-cfg.clip_low, cfg.clip_high], on the side
    that the advantage's sign makes pessimistic: c_t = sgn(A) min(sgn(A) l_t, sgn(A) clip(l_t)) (for
    A > 0 only the upper bound acts, for A < 0 only the lower).  The sequence ratio is the geometric
    mean s_i = exp(mean_t c_t) over its valid tokens and the sequence loss -A_i s_i (GMPO objective,
    token-level clipping "in log space" with range (e^-0.4, e^0.4) in the paper, §4).
    The per-token matrix holds -A_i exp(sg[log s_i] + c_t - sg[c_t]): value -A_i s_i at every valid
    token, gradient -A_i s_i dc_t/dlogp_t, so ``seq-mean-token-mean`` gives exactly the value and
    gradient of mean_i(-A_i s_i).  Needs a sequence-constant advantage and that aggregation
    (``AlgoConfig`` checks both).  Metrics: ``pg_clipfrac`` tokens whose clip is active (gradient 0),
    ``pg_clipfrac_high`` A > 0 and l > clip_high, ``pg_clipfrac_low`` A < 0 and l < -clip_low.
    """
    valid, adv, log_ratio = _masked_inputs(logp, old_logp, adv, mask)
    sgn = torch.sign(adv)  # (B, T)
    clipped = log_ratio.clamp(-cfg.clip_low, cfg.clip_high)  # (B, T)  log-space clip
    c = sgn * torch.minimum(sgn * log_ratio, sgn * clipped)  # (B, T)  pessimistic side; 0 where A = 0
    seq_log = masked_mean(c, valid, dim=-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).detach()  # (B,) log s_i
    token_part = torch.where(valid, c - c.detach(), torch.zeros_like(c))  # (B, T)  value 0, carries dc_t
    loss = -adv * torch.exp(seq_log[:, None] + token_part)  # (B, T)
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    with torch.no_grad():
        active = (adv != 0) & (c != log_ratio)  # (B, T)  the clip replaced l_t (gradient 0 there)
        flags = _flags(valid, active, (adv > 0) & (log_ratio > cfg.clip_high), (adv < 0) & (log_ratio < -cfg.clip_low))
    return loss, _metrics(logp, old_logp, valid, **flags)


def _dppo(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, cfg: Any,
          inside: "Any") -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO's shared form: loss_t = -A_t sg(w_t) logp_t M_t, w_t = min(r_t, cfg.clip_c) (no cap when clip_c = 0),
    M_t = 1 when the token's divergence keeps it inside the trust region (``inside(p, q, pos)``)."""
    valid, adv, log_ratio = _masked_inputs(logp, old_logp, adv, mask)
    ratio = _ratio(log_ratio).detach()  # (B, T)
    weight = ratio.clamp(max=float(cfg.clip_c)) if cfg.clip_c > 0 else ratio  # (B, T)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    lp = torch.where(valid, logp, zero).detach()  # (B, T)
    lq = torch.where(valid, old_logp, zero)  # (B, T)
    keep = valid & inside(lp, lq, adv > 0)  # (B, T)  the trust-region mask, no gradient
    loss = torch.where(keep, -adv * weight * torch.where(valid, logp, zero), zero)  # (B, T)
    out = ~keep
    capped = (ratio > cfg.clip_c) if cfg.clip_c > 0 else torch.zeros_like(valid)
    flags = _flags(valid, out, out & (adv > 0), out & (adv < 0), capped & keep)
    return loss, _metrics(logp, old_logp, valid, **flags)


def _tv_inside(cfg: Any) -> Any:
    def inside(lp: Tensor, lq: Tensor, pos: Tensor) -> Tensor:
        d = torch.exp(lp) - torch.exp(lq)  # (B, T)  signed change of the sampled token's probability
        return torch.where(pos, d <= cfg.clip_high, d >= -cfg.clip_low)

    return inside


def _kl_inside(cfg: Any) -> Any:
    def inside(lp: Tensor, lq: Tensor, pos: Tensor) -> Tensor:
        p, q = torch.exp(lp), torch.exp(lq)  # (B, T)
        rest = torch.where(q < 1, (1 - q) * (torch.log1p(-q) - torch.log1p(-p)), torch.zeros_like(q))
        kl = q * (lq - lp) + rest  # (B, T)  KL(Bern(q) || Bern(p)), q = pi_old(y_t), p = pi(y_t)
        return torch.where(pos, (kl <= cfg.clip_high) | (p <= q), (kl <= cfg.clip_low) | (p >= q))

    return inside


def dppo_tv_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor,
                 cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO-Binary-TV (Qi et al. 2026, arXiv:2602.04879): a trust region on the sampled token's probability.

    loss_t = -A_t sg(min(r_t, C)) logp_t M_t with C = cfg.clip_c (0: no cap) and M_t = 1 iff
    p_t - q_t <= cfg.clip_high (A_t > 0) or p_t - q_t >= -cfg.clip_low (A_t <= 0), p = pi(y_t),
    q = pi_old(y_t): the binary total variation |p - q| bounds the move in the direction A pushes.
    Inside the region the gradient is PPO's, -A r grad logp (for r <= C).  The paper's delta: 0.15.
    Metrics: ``pg_clipfrac`` tokens outside the region (gradient 0), ``_high`` / ``_low`` by A's sign,
    ``pg_clipfrac_dual`` tokens inside whose weight hit the cap C.
    """
    return _dppo(logp, old_logp, adv, mask, cfg, _tv_inside(cfg))


def dppo_kl_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor,
                 cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO-Binary-KL (Qi et al. 2026, arXiv:2602.04879): as ``dppo_tv`` with the binary KL as divergence.

    M_t = 1 iff KL(Bern(q) || Bern(p)) = q log(q/p) + (1 - q) log((1 - q)/(1 - p)) <= cfg.clip_high or
    p <= q (A_t > 0), and <= cfg.clip_low or p >= q (A_t <= 0): only a move in the direction the
    advantage pushes, past the divergence delta, is masked.  The paper's delta: 0.05.
    """
    return _dppo(logp, old_logp, adv, mask, cfg, _kl_inside(cfg))


def _covariance(logp: Tensor, adv: Tensor, valid: Tensor) -> Tensor:
    """(A - mean A)(logp - mean logp) per token, means over the valid tokens; detached (Cui et al. 2025 eq. for Cov)."""
    with torch.no_grad():
        lp = torch.where(valid, logp, torch.zeros_like(logp))
        return (adv - masked_mean(adv, valid)) * (lp - masked_mean(lp, valid))  # (B, T)


def _count(ratio: float, valid: Tensor) -> int:
    return max(int(ratio * int(valid.sum())), 1)


def clip_cov_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor,
                  cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv:2505.22617, §4).

    The PPO clipped surrogate (``clip``, with cfg.clip_low / clip_high / clip_c), except that
    max(1, floor(cfg.clip_cov_ratio * n_valid)) tokens drawn at random (torch's global generator)
    among those with cfg.clip_cov_lb < Cov_t < cfg.clip_cov_ub and not already clipped by PPO get
    loss 0 (no gradient), Cov_t = (A_t - mean A)(logp_t - mean logp) over the valid tokens: the
    tokens whose update would lower the entropy most are held out.  Extra metric ``cov_clipfrac``.
    """
    valid, adv, log_ratio = _masked_inputs(logp, old_logp, adv, mask)
    loss, flags = _surrogate(_ratio(log_ratio), adv, valid, cfg)
    cov = _covariance(logp, adv, valid)  # (B, T)
    cand = valid & ~flags["clipfrac"] & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)  # (B, T)
    idx = cand.flatten().nonzero().squeeze(1)  # candidate positions, row-major
    pick = idx[torch.randperm(len(idx), device=idx.device)[:_count(cfg.clip_cov_ratio, valid)]]
    held = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
    held[pick] = True
    held = held.view_as(valid)  # (B, T)
    loss = torch.where(held, torch.zeros_like(loss), loss)  # (B, T)
    metrics = _metrics(logp, old_logp, valid, **flags)
    metrics["cov_clipfrac"] = masked_mean(held.float(), valid)
    return loss, metrics


def kl_cov_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor,
                cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617, §4): a KL penalty on the highest-covariance tokens.

    loss_t = -A_t r_t, plus cfg.kl_cov_coef * |log r_t| on the max(1, floor(cfg.kl_cov_ratio * n_valid))
    valid tokens with the largest Cov_t (defined as in ``clip_cov_loss``).  No clip: clip fractions
    are 0.  Extra metric ``cov_klfrac``: the fraction of valid tokens penalised.
    """
    valid, adv, log_ratio = _masked_inputs(logp, old_logp, adv, mask)
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)
    loss = -adv * torch.exp(log_ratio)  # (B, T)
    cov = torch.where(valid, _covariance(logp, adv, valid), torch.full_like(log_ratio, -torch.inf))  # (B, T)
    n_valid = int(valid.sum())
    penalised = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
    if n_valid:
        penalised[torch.topk(cov.flatten(), min(_count(cfg.kl_cov_ratio, valid), n_valid)).indices] = True
    penalised = penalised.view_as(valid)  # (B, T)
    loss = loss + torch.where(penalised, cfg.kl_cov_coef * log_ratio.abs(), torch.zeros_like(loss))
    loss = torch.where(valid, loss, torch.zeros_like(loss))  # (B, T)
    metrics = _metrics(logp, old_logp, valid, **_no_clip_flags(valid))
    metrics["cov_klfrac"] = masked_mean(penalised.float(), valid)
    return loss, metrics
