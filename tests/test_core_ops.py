import math

import pytest
import torch

from rlft.core.ops import (
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from numerics import assert_rounding_close


@pytest.fixture
def ragged():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = torch.tensor(
        [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.float64
    )
    return x, mask


def _valid_values(x, mask):
    return [x[i, j].item() for i in range(x.shape[0]) for j in range(x.shape[1]) if mask[i, j]]


# ---------------------------------------------------------------- hand-computed


def test_masked_mean_hand():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert masked_sum(x, mask).item() == 6.0
    assert masked_mean(x, mask).item() == 2.0
    assert masked_mean(x, mask, dim=-1).tolist() == [1.5, 3.0]
    assert masked_sum(x, mask, dim=0).tolist() == [4.0, 2.0, 0.0]


def test_masked_mean_empty_is_zero_not_nan():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    mask = torch.tensor([[0, 0], [1, 0]])
    assert masked_mean(x, torch.zeros(2, 2)).item() == 0.0
    row = masked_mean(x, mask, dim=-1)
    assert row.tolist() == [0.0, 3.0]
    row.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_masked_var_hand():
    x = torch.tensor([[1.0, 0.0, 0.0, 1.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(0.25)
    assert masked_var(x, mask).item() == pytest.approx(1.0 / 3.0)
    assert masked_var(x, torch.tensor([[0, 0, 1, 0, 0]])).item() == 0.0  # n < 2
    assert masked_var(x, torch.zeros(1, 5)).item() == 0.0


def test_masked_whiten_hand():
    x = torch.tensor([[1.0, 0.0, 0.0, 1.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    w = masked_whiten(x, mask, eps=0.0)
    assert w[0, :4].tolist() == pytest.approx([math.sqrt(3) / 2, -math.sqrt(3) / 2, -math.sqrt(3) / 2, math.sqrt(3) / 2])
    assert w[0, 4].item() == 0.0
    w2 = masked_whiten(x, mask, shift_mean=False, eps=0.0)
    assert w2[0, :4].tolist() == pytest.approx((w[0, :4] + 0.5).tolist())


# ---------------------------------------------------------------- naive loops


def test_masked_ops_vs_loop(ragged):
    x, mask = ragged
    vals = _valid_values(x, mask)
    n = len(vals)
    mean = sum(vals) / n
    var_b = sum((v - mean) ** 2 for v in vals) / n
    var_u = sum((v - mean) ** 2 for v in vals) / (n - 1)
    assert masked_sum(x, mask).item() == pytest.approx(sum(vals))
    assert masked_mean(x, mask).item() == pytest.approx(mean)
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(var_b)
    assert masked_var(x, mask).item() == pytest.approx(var_u)
    w = masked_whiten(x, mask, eps=0.0)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            want = (x[i, j].item() - mean) / math.sqrt(var_u) if mask[i, j] else 0.0
            assert w[i, j].item() == pytest.approx(want)
    for i in range(x.shape[0]):
        row = [x[i, j].item() for j in range(x.shape[1]) if mask[i, j]]
        want = sum(row) / len(row) if row else 0.0
        assert masked_mean(x, mask, dim=-1)[i].item() == pytest.approx(want)


def test_logprobs_vs_log_softmax():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 11, generator=g, dtype=torch.float64) * 4  # float64: same code, rounding ~1e-15
    labels = torch.randint(0, 11, (3, 5), generator=g)
    got = logprobs_from_logits(logits, labels)
    want = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    assert got.shape == (3, 5) and got.dtype == torch.float64
    assert logprobs_from_logits(logits.float(), labels).dtype == torch.float32
    torch.testing.assert_close(got, want)


def test_logprobs_bf16_is_float32_and_accurate():
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(2, 4, 50, generator=g) * 5).to(torch.bfloat16)
    labels = torch.randint(0, 50, (2, 4), generator=g)
    got = logprobs_from_logits(logits, labels)
    want = torch.log_softmax(logits.double(), -1).gather(-1, labels[..., None]).squeeze(-1)
    assert got.dtype == torch.float32
    # float32 z_y - logsumexp(z) over V = 50: two nested reductions, the last over |z_y| + |lse| (+1 for the
    # relative error of the sum of exps): ~3e-4 here; bf16 arithmetic is off by 5e-2, fp16 by 6e-3
    lse = torch.logsumexp(logits.double(), -1)
    scale = (1 + (want + lse).abs() + lse.abs()).max().item()
    assert_rounding_close(got, want, n_terms=50, scale=scale, depth=2, what="bf16 logprobs")


def test_logprobs_gradient_matches_log_softmax():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(2, 3, 7, generator=g, dtype=torch.float64, requires_grad=True)  # float64: rounding ~1e-16
    b = a.detach().clone().requires_grad_(True)
    labels = torch.randint(0, 7, (2, 3), generator=g)
    logprobs_from_logits(a, labels).sum().backward()
    torch.log_softmax(b, -1).gather(-1, labels[..., None]).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_entropy_vs_naive_loop():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 6, generator=g, dtype=torch.float64) * 3
    got = entropy_from_logits(logits)
    for i in range(2):
        for t in range(3):
            z = logits[i, t].tolist()
            zmax = max(z)
            s = sum(math.exp(v - zmax) for v in z)
            p = [math.exp(v - zmax) / s for v in z]
            assert got[i, t].item() == pytest.approx(-sum(pi * math.log(pi) for pi in p))


def test_entropy_stable_and_bf16():
    logits = torch.tensor([[[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]]])
    h = entropy_from_logits(logits)
    assert torch.isfinite(h).all()
    assert h[0, 0].item() == pytest.approx(0.0, abs=1e-6)
    assert h[0, 1].item() == pytest.approx(math.log(3))
    hb = entropy_from_logits(torch.zeros(2, 3, 8, dtype=torch.bfloat16))
    assert hb.dtype == torch.float32
    torch.testing.assert_close(hb, torch.full((2, 3), math.log(8)))


# ---------------------------------------------------------------- invariance


def test_values_under_mask_change_nothing(ragged):
    x, mask = ragged
    y = x.clone()
    y[mask == 0] = float("nan")
    z = x.clone()
    z[mask == 0] = 1e30
    for other in (y, z):
        assert masked_sum(other, mask).item() == pytest.approx(masked_sum(x, mask).item())
        assert masked_mean(other, mask).item() == pytest.approx(masked_mean(x, mask).item())
        assert masked_var(other, mask).item() == pytest.approx(masked_var(x, mask).item())
        torch.testing.assert_close(masked_mean(other, mask, dim=-1), masked_mean(x, mask, dim=-1))
        torch.testing.assert_close(masked_whiten(other, mask), masked_whiten(x, mask))


def test_gradient_ignores_junk_under_mask(ragged):
    x, mask = ragged
    x = x.clone()
    x[mask == 0] = float("nan")
    x.requires_grad_(True)
    for fn in (masked_mean, masked_var, lambda a, m: masked_whiten(a, m)[0, 0]):
        x.grad = None
        fn(x, mask).backward()
        assert torch.isfinite(x.grad).all()
        assert (x.grad[mask == 0] == 0).all()
