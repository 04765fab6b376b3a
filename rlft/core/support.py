"""Sampling-support replay: log-probs and entropies over the set of tokens a truncated sampler drew from.

With top-k, top-p or min-p, the token at a position is drawn from the truncated, renormalised distribution

  p~(v) = p(v) / S   for v in K,   0 elsewhere,   S = sum_{u in K} p(u),

K the *kept set* the truncation left (the k most likely tokens; the smallest prefix of them holding mass top_p;
those with p(u) >= min_p max p). The sampler's log-prob of its token is log p~(y); a trainer that takes log p(y)
over the whole vocabulary instead differs by log S at every token, so its importance ratio pi / pi_sampler carries
the factor S (below 1: the gradient is scaled down by the mass the truncation dropped), and its KL and entropy terms
refer to a distribution that did not sample. Replaying the support: the sampler records K for every token it draws,
and the trainer computes, from the same logits z = logits / temperature,

  log p~(y) = z_y - logsumexp_{u in K} z_u,     H~ = logsumexp_{u in K} z_u - sum_{u in K} p~(u) z_u,

for the policy, the old policy and the reference alike (the same K for all three: the ratio and the KL compare
distributions over one support). DeepSeek-V3.2 calls this "keep sampling mask".

A kept set is a row of ids (N, K) long padded with -1 (``PAD``), in any order; a row of padding alone marks a
position that was not truncated (top_p = 1, top_k = 0, min_p = 0; or a sampler that kept no sets): its log-prob and
entropy are the full distribution's. The sampled token is in its kept set by construction; where it is not (a kept
set from another engine, rounded differently), log p~(y) is still z_y - logsumexp over K, a finite number.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

PAD = -1
#: Bytes of gathered output-head rows (n tokens x K kept ids x H) one block of ``kept_logprobs_from_states`` holds.
BLOCK_BYTES = 64 * 2**20


def kept_ids(scores: Tensor) -> Tensor:
    """The kept set of each row of sampling scores (b, V) whose dropped entries are -inf (a truncating warper's
    output): the ids of the finite entries (b, k), the highest score first, -1 padding to the widest row's k."""
    finite = torch.isfinite(scores)  # (b, V)
    k = max(int(finite.sum(1).max()), 1) if scores.shape[0] else 1
    values, ids = scores.topk(k, dim=1)  # (b, k) the finite entries first, in descending order
    return ids.masked_fill(~torch.isfinite(values), PAD)


def _replayed(z_y: Tensor, z_kept: Tensor, valid: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """(z_y - lse(z over K), H~) per row from the chosen logit z_y (n,), the logits at the kept ids (n, K) and
    which of those ids are real (n, K) bool; float32 at least (float64 stays)."""
    z_kept = z_kept.masked_fill(~valid, float("-inf"))
    lse = torch.logsumexp(z_kept, dim=-1)  # (n,)
    logp = z_y - lse
    if not with_entropy:
        return logp, None
    p = torch.softmax(z_kept, dim=-1)  # (n, K) 0 at the padding
    return logp, lse - (p * z_kept.masked_fill(~valid, 0.0)).sum(-1)


def _float(x: Tensor) -> Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def kept_logprobs(logits: Tensor, labels: Tensor, kept: Tensor, *, with_entropy: bool = False) -> tuple:
    """(log p~(labels), H~ or None) over each position's kept set, from logits (..., V) already divided by the
    temperature, labels (...) and kept sets (..., K) (-1 padding); a position whose kept set is empty gets the full
    distribution's log-prob and entropy. float32 (float64 logits stay float64)."""
    if kept.shape[:-1] != labels.shape or logits.shape[:-1] != labels.shape:
        raise ValueError(f"kept_logprobs: logits (..., V), labels (...) and kept (..., K) must share their leading "
                         f"shape, got {tuple(logits.shape)}, {tuple(labels.shape)}, {tuple(kept.shape)}")
    z = _float(logits)
    valid = kept != PAD  # (..., K)
    z_y = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (...)
    z_kept = z.gather(-1, kept.clamp(min=0))  # (..., K)
    logp, ent = _replayed(z_y, z_kept, valid, with_entropy)
    full = ~valid.any(-1)  # (...) not truncated: the whole vocabulary
    if bool(full.any()):
        lse = torch.logsumexp(z, dim=-1)
        logp = torch.where(full, z_y - lse, logp)
        if with_entropy:
            ent = torch.where(full, lse - (torch.softmax(z, dim=-1) * z).sum(-1), ent)
    return logp, ent


def _block(h: Tensor, weight: Tensor, bias: Tensor | None, ids: Tensor, temperature: float) -> Tensor:
    """Logits (n, K) at the ids (n, K) (clamped padding included) of rows h (n, H), in the dtype the plain path
    computes them in (autocast's where it is on), then float32 at least."""
    device = h.device.type
    compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else \
        torch.promote_types(h.dtype, weight.dtype)
    with torch.autocast(device, enabled=False):
        w = weight[ids].to(compute)  # (n, K, H)
        z = torch.bmm(w, h.to(compute).unsqueeze(-1)).squeeze(-1)  # (n, K)
        if bias is not None:
            z = z + bias[ids].to(compute)
    z = _float(z)
    return z / temperature if temperature != 1.0 else z


def kept_logprobs_from_states(h: Tensor, weight: Tensor, targets: Tensor, kept: Tensor, *, bias: Tensor | None = None,
                              temperature: float = 1.0, with_entropy: bool = False) -> tuple:
    """``kept_logprobs`` for z = (h W^T + b) / temperature from hidden states h (N, H), the output projection
    ``weight`` (V, H), ``bias`` (V,), targets (N,) and kept sets (N, K), every row with at least one kept id,
    without the (N, V) logits: only the 1 + K logits a row needs, a block of rows at a time, each block recomputed
    in the backward (checkpointed) instead of keeping its gathered head rows. Differentiable in h, weight, bias."""
    if h.dim() != 2 or kept.dim() != 2 or kept.shape[0] != h.shape[0] or targets.shape != h.shape[:1]:
        raise ValueError(f"kept_logprobs_from_states: h (N, H), targets (N,) and kept (N, K), got {tuple(h.shape)}, "
                         f"{tuple(targets.shape)}, {tuple(kept.shape)}")
    if len(kept) and not bool((kept != PAD).any(1).all()):
        raise ValueError("kept_logprobs_from_states: every row needs a kept set (rows without one take the full "
                         "distribution's path)")
    ids = torch.cat([targets[:, None], kept.clamp(min=0)], dim=1)  # (N, 1 + K): the target's logit first
    valid = kept != PAD
    per = max(1, BLOCK_BYTES // max(1, ids.shape[1] * h.shape[1] * weight.element_size()))

    def run(hb: Tensor, w: Tensor, b: Tensor | None, ib: Tensor, vb: Tensor) -> tuple[Tensor, Tensor]:
        z = _block(hb, w, b, ib, temperature)
        logp, ent = _replayed(z[:, 0], z[:, 1:], vb, with_entropy)
        return logp, ent if ent is not None else logp.new_zeros(0)

    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad))
    parts = [checkpoint(run, h[s:s + per], weight, bias, ids[s:s + per], valid[s:s + per], use_reentrant=False)
             if grad else run(h[s:s + per], weight, bias, ids[s:s + per], valid[s:s + per])
             for s in range(0, h.shape[0], per)]
    if not parts:
        empty = h.new_zeros(0, dtype=torch.promote_types(h.dtype, torch.float32))
        return empty, empty if with_entropy else None
    logp = torch.cat([p[0] for p in parts])
    return logp, torch.cat([p[1] for p in parts]) if with_entropy else None
