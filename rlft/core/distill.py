"""On-policy distillation: the student samples, teachers score the same tokens, the per-token reverse KL is the signal.

With ``logp = log pi(y_t)`` (the student) and ``teacher_logp = log pi_T(y_t)`` at the tokens the student sampled,
``d_t = logp - teacher_logp`` is the single-sample (k1) estimate of the per-token reverse KL
KL(pi(.|ctx_t) || pi_T(.|ctx_t)) at the student's own context. GKD (Agarwal et al. 2024) trains on that
divergence summed over the whole vocabulary, on student samples (TRL's ``GKDTrainer`` with ``lmbda=1``, its
generalised JSD at the end of ``beta`` that is the reverse KL: ``beta=1`` in ms-swift's documentation); here it is
the sampled token's, which needs no full logits of either model. Two ways to train on it:

* **advantage** (Thinking Machines, "On-Policy Distillation", 2025): ``A_t = -coef * d_t``, detached, per token,
  with discount 0 (no return over later tokens), trained by the run's policy loss like any advantage; the task
  reward's advantage can be added with a weight.
* **loss**: ``coef * d_t`` in the loss with the value of k1 and the gradient of k2 (``rlft.core.kl.k1_plus``):
  ``d_t * grad log pi(y_t)``, the score-function gradient of the per-token reverse KL at a sample of pi
  (E_pi[grad d_t] = E_pi[grad log pi] = 0, so k1 alone would train nothing). Its value is the reverse-KL estimate
  of the current student; with one update pass and old == current weights its gradient equals the advantage mode's
  under a ratio loss.

Several teachers: ``teacher_logp = sum_k w_k log pi_k(y_t)`` with weights summing to 1 (a normalised geometric
mixture's log-prob up to its normaliser), so ``d_t = sum_k w_k (logp - log pi_k(y_t))``: the weighted mean of the
per-teacher reverse-KL estimates.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rlft.core.kl import k1_plus


def mixed_teacher_logp(teacher_logps: Tensor, weights: Sequence[float]) -> Tensor:
    """sum_k w_k * teacher_logps[k] with ``weights`` normalised to sum 1: (K, B, T) -> (B, T)."""
    if teacher_logps.shape[0] != len(weights):
        raise ValueError(f"{teacher_logps.shape[0]} teachers' log-probs for {len(weights)} weights")
    w = torch.tensor(weights, dtype=teacher_logps.dtype, device=teacher_logps.device)  # (K,)
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or float(w.sum()) <= 0:
        raise ValueError(f"teacher weights must be finite, >= 0 and not all 0, got {list(weights)}")
    return torch.einsum("k,kbt->bt", w / w.sum(), teacher_logps)  # (B, T)


def reverse_kl(logp: Tensor, teacher_logp: Tensor) -> Tensor:
    """d_t = log pi(y_t) - log pi_T(y_t): the sampled token's estimate of KL(pi || pi_T) at its context: (B, T)."""
    return logp - teacher_logp  # (B, T)


def reverse_kl_advantage(logp: Tensor, teacher_logp: Tensor, mask: Tensor, coef: float = 1.0) -> Tensor:
    """A_t = -coef * (log pi(y_t) - log pi_T(y_t)) at valid tokens, 0 elsewhere (Thinking Machines 2025): (B, T).

    Detached: the advantage is fixed at rollout time."""
    d = reverse_kl(logp.detach(), teacher_logp.detach())  # (B, T)
    return torch.where(mask != 0, -coef * d, torch.zeros_like(d))  # (B, T)


def reverse_kl_loss(logp: Tensor, teacher_logp: Tensor) -> Tensor:
    """Per-token loss of the loss mode: value d_t, gradient d_t * grad log pi(y_t) (k1's value, k2's gradient);
    the teacher carries no gradient. Reduce with the loss mask and the run's aggregation: (B, T)."""
    return k1_plus(logp, teacher_logp.detach())  # (B, T)
