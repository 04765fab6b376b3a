"""Sampling-support replay's maths (``rlft.core.support``): log-probs and entropies over a kept set.

A hand case; the states path (1 + K logits per token, checkpointed blocks) against the logits path for values and
the gradients of h, W and b, within a rounding bound that holds by construction; both against a naive loop that
masks each token's dropped logits to -inf; invariances (the order of a kept set and its padding change nothing, a
position with no kept set is the full distribution's, bit for bit); the kept ids of a warper's scores; clear errors.
"""

from __future__ import annotations

import math

import pytest
import torch

import rlft.core.support as support
from rlft.core.ops import entropy_from_logits, logprobs_from_logits
from rlft.core.support import PAD, kept_ids, kept_logprobs, kept_logprobs_from_states
from numerics import assert_rounding_close, rounding_differs


def test_hand_case():
    """z = (2, 1, 0, -1), kept {0, 1}, token 1: log p~ = 1 - ln(e^2 + e) = -ln(1 + e) = -1.3133;
    p~ = (e/(1+e), 1/(1+e)), H~ = ln(1 + e) - e/(1+e) = 0.5822."""
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=torch.float64)
    logp, ent = kept_logprobs(z, torch.tensor([1]), torch.tensor([[1, 0, PAD]]), with_entropy=True)
    e = math.e
    assert logp.item() == pytest.approx(-math.log(1 + e), abs=1e-12)
    assert ent.item() == pytest.approx(math.log(1 + e) - e / (1 + e), abs=1e-12)
    assert logp.dtype == torch.float64
    # the same through the states path: h = 1, W = z, temperature 0.5 halves the logits
    h = torch.ones(1, 1, dtype=torch.float64)
    lp, en = kept_logprobs_from_states(h, 2 * z.T, torch.tensor([1]), torch.tensor([[0, 1]]), temperature=2.0,
                                       with_entropy=True)
    assert lp.item() == pytest.approx(-math.log(1 + e), abs=1e-12) and en.item() == pytest.approx(ent.item(), abs=1e-12)


def naive(logits: torch.Tensor, labels: torch.Tensor, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token at a time: the dropped logits set to -inf, then the plain log-softmax and entropy."""
    lps, ents = [], []
    for z, y, ids in zip(logits, labels, kept):
        ids = [int(i) for i in ids if i >= 0]
        if ids:
            out = torch.ones_like(z, dtype=torch.bool)
            out[ids] = False
            z = z.masked_fill(out, float("-inf"))
        lp = torch.log_softmax(z.double(), -1)
        lps.append(lp[y])
        ents.append(-(lp.exp() * lp.nan_to_num(neginf=0.0)).sum())
    return torch.stack(lps), torch.stack(ents)


def problem(N=40, H=16, V=300, K=12, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(N, H, generator=g) * 2).to(dtype).requires_grad_()
    W = torch.randn(V, H, generator=g).to(dtype).requires_grad_()
    b = torch.randn(V, generator=g).to(dtype).requires_grad_()
    kept = torch.full((N, K), PAD)
    targets = torch.empty(N, dtype=torch.long)
    for n in range(N):  # kept sets of 1..K distinct ids, the target among them, padding in the middle too
        k = 1 + n % K
        ids = torch.randperm(V, generator=g)[:k]
        cols = torch.randperm(K, generator=g)[:k]
        kept[n, cols] = ids
        targets[n] = ids[n % k]
    return h, W, b, targets, kept


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_states_path_equals_logits_path_and_the_naive_loop_with_gradients(temperature, monkeypatch):
    monkeypatch.setattr(support, "BLOCK_BYTES", 16 * 12 * 4 * 7)  # blocks of 7 rows: 40 = 5 x 7 + 5
    h, W, b, y, kept = problem()
    lp_s, en_s = kept_logprobs_from_states(h, W, y, kept, bias=b, temperature=temperature, with_entropy=True)
    grads_s = torch.autograd.grad((lp_s * torch.linspace(-1, 2, len(y))).sum() + en_s.sum(), (h, W, b))
    z = (h @ W.T + b) / temperature  # (N, V)
    lp_z, en_z = kept_logprobs(z, y, kept, with_entropy=True)
    grads_z = torch.autograd.grad((lp_z * torch.linspace(-1, 2, len(y))).sum() + en_z.sum(), (h, W, b))
    lp_n, en_n = naive(z, y, kept)
    scale = 1 + float(z.detach().abs().max())
    for a, c, what in ((lp_s, lp_z, "logp"), (en_s, en_z, "entropy"), (lp_z, lp_n, "logp vs naive"),
                       (en_z, en_n, "entropy vs naive")):
        assert_rounding_close(a.detach(), c.detach(), n_terms=300, scale=scale, depth=3, what=what)
    for gs, gz, name in zip(grads_s, grads_z, "hWb"):
        assert_rounding_close(gs, gz, n_terms=300, scale=scale * 40 * 3, depth=4, what=f"grad {name}")
    # the replay is not the full distribution: a planted bug (no renormalisation) fails the bound
    assert rounding_differs(lp_z.detach(), logprobs_from_logits(z[None], y[None])[0].detach(), n_terms=300,
                            scale=scale, depth=3)


def test_gradient_equals_the_naive_loop():
    h, W, b, y, kept = problem(N=9, V=50, K=5, dtype=torch.float64)
    lp, _ = kept_logprobs_from_states(h, W, y, kept, bias=b)
    g = torch.autograd.grad(lp.sum(), (h, W, b))
    lp_n, _ = naive(h @ W.T + b, y, kept)
    g_n = torch.autograd.grad(lp_n.sum(), (h, W, b))
    for a, c in zip(g, g_n):
        assert torch.allclose(a, c, atol=1e-12, rtol=0)


def test_order_and_padding_of_a_kept_set_change_nothing():
    h, W, b, y, kept = problem(N=10, V=60, K=6, dtype=torch.float64)
    z = (h @ W.T + b).detach()
    lp, en = kept_logprobs(z, y, kept, with_entropy=True)
    shuffled = kept[:, torch.randperm(6)]
    padded = torch.cat([torch.full((10, 3), PAD), kept], dim=1)
    for other in (shuffled, padded):
        lp2, en2 = kept_logprobs(z, y, other, with_entropy=True)
        assert torch.allclose(lp, lp2, atol=1e-12, rtol=0) and torch.allclose(en, en2, atol=1e-12, rtol=0)
    # ids outside the kept set: their logits change nothing
    z2 = z.clone()
    outside = torch.ones_like(z, dtype=torch.bool)
    outside.scatter_(1, kept.clamp(min=0), False)
    outside[torch.arange(10), y] = False
    z2[outside] += 5.0
    assert torch.equal(kept_logprobs(z2, y, kept)[0], lp)


def test_no_kept_set_is_the_full_distribution_bit_for_bit():
    z = torch.randn(3, 5, 40)
    y = torch.randint(0, 40, (3, 5))
    none = torch.full((3, 5, 4), PAD)
    lp, en = kept_logprobs(z, y, none, with_entropy=True)
    assert torch.equal(lp, logprobs_from_logits(z, y))
    assert torch.allclose(en, entropy_from_logits(z), atol=1e-6, rtol=0)
    some = none.clone()
    some[1, 2, :2] = torch.tensor([y[1, 2], (y[1, 2] + 1) % 40])
    lp2 = kept_logprobs(z, y, some)[0]
    changed = (lp2 != lp)
    assert changed[1, 2] and changed.sum() == 1  # only the position with a kept set moved
    assert lp2[1, 2] > lp[1, 2]  # renormalised over two tokens: more likely


def test_kept_ids_of_warped_scores():
    scores = torch.tensor([[0.5, float("-inf"), 2.0, 1.0], [float("-inf"), 3.0, float("-inf"), float("-inf")]])
    assert kept_ids(scores).tolist() == [[2, 3, 0], [1, PAD, PAD]]
    assert kept_ids(torch.zeros(0, 4)).shape == (0, 1)


def test_bad_shapes_and_rows_without_a_set_are_named():
    with pytest.raises(ValueError, match="leading shape"):
        kept_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"h \(N, H\)"):
        kept_logprobs_from_states(torch.zeros(2, 3), torch.zeros(5, 3), torch.zeros(2, dtype=torch.long),
                                  torch.zeros(3, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="every row needs a kept set"):
        kept_logprobs_from_states(torch.zeros(2, 3), torch.zeros(5, 3), torch.zeros(2, dtype=torch.long),
                                  torch.tensor([[0], [PAD]]))
    lp, en = kept_logprobs_from_states(torch.zeros(0, 3), torch.zeros(5, 3), torch.zeros(0, dtype=torch.long),
                                       torch.zeros(0, 2, dtype=torch.long), with_entropy=True)
    assert lp.shape == (0,) and en.shape == (0,)


def test_bf16_autocast_computes_the_logits_in_bf16():
    h, W, b, y, kept = problem(N=6, V=80, K=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, _ = kept_logprobs_from_states(h, W, y, kept, bias=b)
    assert lp.dtype == torch.float32
    z = torch.nn.functional.linear(h.bfloat16(), W.bfloat16(), b.bfloat16()).float()
    ref = kept_logprobs(z, y, kept)[0]
    assert_rounding_close(lp.detach(), ref.detach(), n_terms=16, scale=1 + float(z.detach().abs().max()), depth=2,
                          dtype=torch.bfloat16, what="bf16 autocast")
