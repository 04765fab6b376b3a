"""Masked tensor reductions and log-prob / entropy from logits.

Conventions fixed here for the whole library:

* ``mask`` is a binary (B, T) tensor (bool or 0/1 float) of valid response
  tokens.  A position is valid iff ``mask != 0``; values at invalid positions are
  *selected away* (``torch.where``), never multiplied by 0, so a NaN or inf in
  padding cannot leak into a result.
* Empty reductions return 0, never NaN (``masked_mean`` over an all-zero mask,
  ``masked_var`` with fewer than 2 valid elements).
* Log-probabilities and entropies are returned in float32 (or float64 for
  float64 logits) whatever the logits' dtype, and are computed one row of the
  leading dimension at a time for low-precision logits so that the float32 copy
  never exceeds (T, V).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _valid(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Broadcast ``mask`` to ``x`` as bool; return (x with invalid -> 0, bool mask)."""
    keep = (mask != 0).expand_as(x)  # same shape as x
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)), keep


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over valid positions (all of them, or along ``dim``)."""
    xv, _ = _valid(x, mask)
    return xv.sum() if dim is None else xv.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over valid positions; 0 where nothing is valid."""
    xv, keep = _valid(x, mask)
    total = xv.sum() if dim is None else xv.sum(dim)
    count = keep.sum() if dim is None else keep.sum(dim)
    count = count.to(total.dtype)
    return total / count.clamp(min=1)  # count 0 -> total 0 -> 0, finite gradient


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of all valid elements of ``x`` (a scalar).

    ``unbiased`` applies Bessel's correction n / (n - 1).  With fewer than 2
    valid elements (1 for the biased variance) the variance is 0.
    """
    xv, keep = _valid(x, mask)  # junk under the mask never reaches the arithmetic (or its gradient)
    mean = masked_mean(xv, keep)
    var = masked_mean((xv - mean) ** 2, keep)  # biased
    if unbiased:
        n = keep.sum().to(var.dtype)
        var = torch.where(n > 1, var * n / (n - 1).clamp(min=1), torch.zeros_like(var))
    return var


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) over valid positions (unbiased var).

    With ``shift_mean=False`` the mean is added back (only the scale changes).
    Invalid positions are set to 0 in the output.
    """
    xv, keep = _valid(x, mask)
    mean = masked_mean(xv, keep)
    var = masked_var(xv, keep, unbiased=True)
    out = (xv - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return _valid(out, keep)[0]


def _float_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _per_row(fn, logits: Tensor, *rest: Tensor) -> Tensor:
    """Apply ``fn`` to float32 logits, one leading-dim row at a time if they are low precision."""
    dtype = _float_dtype(logits.dtype)
    if logits.dtype == dtype:
        return fn(logits, *rest)
    rows = [fn(row.to(dtype), *(r[i] for r in rest)) for i, row in enumerate(logits)]
    return torch.stack(rows) if rows else fn(logits.to(dtype), *rest)


def _logprobs(logits: Tensor, labels: Tensor) -> Tensor:
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (..., T)
    return picked - torch.logsumexp(logits, dim=-1)  # log softmax(z)_y = z_y - logsumexp(z)


def _entropy(logits: Tensor) -> Tensor:
    probs = torch.softmax(logits, dim=-1)  # (..., T, V)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)  # H = lse(z) - sum p z


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """log pi(labels) from logits (B, T, V) and labels (B, T) -> (B, T), float32."""
    return _per_row(_logprobs, logits, labels)  # (B, T)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) (B, T, V) -> (B, T), float32."""
    return _per_row(_entropy, logits)  # (B, T)
