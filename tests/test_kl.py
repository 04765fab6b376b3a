import math

import pytest
import torch

from rlft.core.kl import KL_ESTIMATORS, abs_kl, k1, k2, k3
from rlft.core.ops import masked_mean


def test_registry():
    assert KL_ESTIMATORS.names() == ["abs", "k1", "k2", "k3"]


def test_hand_values():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    lr = math.log(0.5)  # log(ref / pi)
    assert k1(logp, ref).item() == pytest.approx(math.log(2))
    assert k2(logp, ref).item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert k3(logp, ref).item() == pytest.approx(0.5 - lr - 1)
    assert abs_kl(ref, logp).item() == pytest.approx(math.log(2))


def test_vs_naive_loop():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 4, generator=g, dtype=torch.float64)
    ref = torch.randn(3, 4, generator=g, dtype=torch.float64)
    for i in range(3):
        for t in range(4):
            d = logp[i, t].item() - ref[i, t].item()
            assert k1(logp, ref)[i, t].item() == pytest.approx(d)
            assert k2(logp, ref)[i, t].item() == pytest.approx(d * d / 2)
            assert k3(logp, ref)[i, t].item() == pytest.approx(math.exp(-d) + d - 1)
            assert abs_kl(logp, ref)[i, t].item() == pytest.approx(abs(d))


@pytest.mark.parametrize("name", ["k2", "k3", "abs"])
def test_non_negative_and_zero_when_equal(name):
    fn = KL_ESTIMATORS.get(name)
    g = torch.Generator().manual_seed(1)
    logp, ref = torch.randn(2, 50, 20, generator=g) * 3
    assert (fn(logp, ref) >= 0).all()
    assert (fn(logp, logp) == 0).all()
    assert (k1(logp, logp) == 0).all()


def test_k3_clamped_is_finite():
    out = k3(torch.tensor([[0.0, -1e4]]), torch.tensor([[-1e4, 0.0]]))
    assert torch.isfinite(out).all()
    assert out[0, 1].item() == pytest.approx(math.exp(20.0) - 21.0, rel=1e-6)


def test_sample_mean_approaches_exact_kl():
    pi = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)
    ref = torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1], dtype=torch.float64)
    exact = (pi * (pi.log() - ref.log())).sum().item()
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(pi, 200_000, replacement=True, generator=g)  # samples from pi
    logp, ref_logp = pi.log()[x][None], ref.log()[x][None]  # (1, N)
    mask = torch.ones_like(logp)
    for name in ("k1", "k3"):  # the unbiased estimators
        est = masked_mean(KL_ESTIMATORS.get(name)(logp, ref_logp), mask).item()
        assert est == pytest.approx(exact, abs=5e-3), name
    # k2 is biased but close for nearby distributions
    assert masked_mean(k2(logp, ref_logp), mask).item() == pytest.approx(exact, rel=0.5)


def test_values_under_mask_change_nothing():
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    ref = torch.tensor([[-1.5, -1.0, -3.0]])
    mask = torch.tensor([[1, 1, 0]])
    logp2, ref2 = logp.clone(), ref.clone()
    logp2[0, 2], ref2[0, 2] = -1e4, 50.0
    for fn in (k1, k2, k3, abs_kl):
        assert masked_mean(fn(logp2, ref2), mask).item() == pytest.approx(masked_mean(fn(logp, ref), mask).item())
