import math

import pytest
import torch

from rlft.core.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    PenaltyCoefController,
    abs_kl,
    k1,
    k1_plus,
    k2,
    k2_plus,
    k3,
    k3_plus,
    kl_penalty_rewards,
    make_kl_controller,
)
from rlft.core.ops import masked_mean


def test_registry():
    assert KL_ESTIMATORS.names() == ["abs", "k1", "k1+", "k2", "k2+", "k3", "k3+"]


def test_hand_values():
    # float64: k3 = 0.5 + 0.69 - 1 cancels, which would cost float32 up to 7e-7 relative
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
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
    n = 200_000
    x = torch.multinomial(pi, n, replacement=True, generator=g)  # samples from pi
    logp, ref_logp = pi.log()[x][None], ref.log()[x][None]  # (1, N)
    mask = torch.ones_like(logp)
    for name in ("k1", "k3"):  # the unbiased estimators
        samples = KL_ESTIMATORS.get(name)(logp, ref_logp)  # (1, N)
        est = masked_mean(samples, mask).item()
        tol = 4.0 * samples.std().item() / math.sqrt(n)  # 4 standard errors of the sample mean
        assert abs(est - exact) < tol, (name, est, exact, tol)
        # the exact expectation under pi is exact KL (no sampling): unbiased by construction
        per_x = KL_ESTIMATORS.get(name)(pi.log()[None], ref.log()[None])[0]  # (5,)
        assert (pi * per_x).sum().item() == pytest.approx(exact, abs=1e-12)
    # k2 is biased but close for nearby distributions: its sample mean is within 4 standard errors of its own
    # expectation, which here lies 3.5% above the exact KL
    samples = k2(logp, ref_logp)
    mean_k2 = (pi * k2(pi.log()[None], ref.log()[None])[0]).sum().item()
    assert abs(masked_mean(samples, mask).item() - mean_k2) < 4.0 * samples.std().item() / math.sqrt(n)
    assert 1.03 * exact < mean_k2 < 1.04 * exact


def test_values_under_mask_change_nothing():
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    ref = torch.tensor([[-1.5, -1.0, -3.0]])
    mask = torch.tensor([[1, 1, 0]])
    logp2, ref2 = logp.clone(), ref.clone()
    logp2[0, 2], ref2[0, 2] = -1e4, 50.0
    for fn in (k1, k2, k3, abs_kl, k1_plus, k2_plus, k3_plus):
        assert masked_mean(fn(logp2, ref2), mask).item() == pytest.approx(masked_mean(fn(logp, ref), mask).item())


# ---------------------------------------------------------------- straight-through "+" estimators


def _value_and_grad(fn, logp, ref):
    x = logp.clone().requires_grad_(True)
    out = fn(x, ref)
    (grad,) = torch.autograd.grad(out.sum(), x)
    return out.detach(), grad


def test_plus_estimators_hand():
    # pi = 0.5, ref = 0.25: log pi - log ref = log 2; value of the base, gradient d k2 / d logp = log 2
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    d = math.log(2)
    want_value = {"k1+": d, "k2+": 0.5 * d * d, "k3+": 0.5 + d - 1}
    for name, value in want_value.items():
        out, grad = _value_and_grad(KL_ESTIMATORS.get(name), logp, ref)
        assert out.item() == pytest.approx(value, abs=1e-15)
        assert grad.item() == pytest.approx(d, abs=1e-15)  # the gradient of k2 for all three
    # the bases differ in gradient: k1 -> 1, k3 -> 1 - ref/pi = 1 - 0.5
    assert _value_and_grad(k1, logp, ref)[1].item() == 1.0
    assert _value_and_grad(k3, logp, ref)[1].item() == pytest.approx(0.5)


def test_plus_estimators_vs_naive_loop():
    g = torch.Generator().manual_seed(4)
    logp = torch.randn(3, 4, generator=g, dtype=torch.float64)
    ref = torch.randn(3, 4, generator=g, dtype=torch.float64)
    for name, base in (("k1+", k1), ("k2+", k2), ("k3+", k3)):
        out, grad = _value_and_grad(KL_ESTIMATORS.get(name), logp, ref)
        assert torch.equal(out, base(logp, ref))  # exactly the base's value: g - sg[g] is exactly 0
        for i in range(3):
            for t in range(4):
                assert grad[i, t].item() == pytest.approx(logp[i, t].item() - ref[i, t].item())  # d k2 / d logp
    assert k2_plus is not k2 and torch.equal(_value_and_grad(k2_plus, logp, ref)[1], _value_and_grad(k2, logp, ref)[1])


def test_plus_gradient_is_unbiased_where_base_is_not():
    # exact expectations under pi (no sampling) of the per-sample gradient w.r.t. the logits of pi:
    # k2's (hence k3+'s) equals grad KL(pi || ref); k3's does not (Schulman 2020; verl kl_penalty "k3+")
    logits = torch.tensor([0.3, -0.2, 1.0, 0.0], dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.tensor([0.0, 0.5, -0.5, 0.2], dtype=torch.float64), -1)
    logp = torch.log_softmax(logits, -1)
    (exact,) = torch.autograd.grad((logp.exp() * (logp - ref)).sum(), logits, retain_graph=True)

    def expected_grad(fn):  # sum_x pi(x) grad_theta fn(log pi(x), log ref(x)), pi(x) held fixed (sampling weight)
        return torch.autograd.grad((logp.exp().detach() * fn(logp[None], ref[None])[0]).sum(), logits,
                                   retain_graph=True)[0]

    torch.testing.assert_close(expected_grad(k3_plus), exact)
    torch.testing.assert_close(expected_grad(k1_plus), exact)
    assert (expected_grad(k3) - exact).abs().max() > 1e-2
    assert expected_grad(k1).abs().max() < 1e-12  # E_pi[grad log pi] = 0: k1 in the loss pulls nowhere


def test_plus_values_under_mask_change_nothing_in_gradient():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0, -3.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    logp2, ref2 = logp.clone(), ref.clone()
    logp2[0, 2], ref2[0, 2] = -50.0, 40.0
    for name in ("k1+", "k2+", "k3+"):
        fn = KL_ESTIMATORS.get(name)
        grads = []
        for lp, rf in ((logp, ref), (logp2, ref2)):
            x = lp.clone().requires_grad_(True)
            masked_mean(fn(x, rf), mask).backward()
            grads.append(x.grad)
        torch.testing.assert_close(grads[0], grads[1])
        assert grads[1][0, 2].item() == 0.0


# ---------------------------------------------------------------- KL reward penalty


def test_kl_penalty_rewards_hand_and_masked():
    # float64: k3 = 0.5 + 0.69 - 1 cancels, which would cost float32 up to 7e-7 relative
    logp = torch.tensor([[math.log(0.5), math.log(0.5), float("nan")]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25), math.log(0.5), float("inf")]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    out = kl_penalty_rewards(logp, ref, mask, 0.1, "k1")
    torch.testing.assert_close(out, torch.tensor([[-0.1 * math.log(2), 0.0, 0.0]], dtype=torch.float64))
    out3 = kl_penalty_rewards(logp, ref, mask, 0.1, "k3")
    assert out3[0, 0].item() == pytest.approx(-0.1 * (0.5 - math.log(0.5) - 1))
    assert out3[0, 2].item() == 0.0
    with pytest.raises(KeyError, match="k3"):
        kl_penalty_rewards(logp, ref, mask, 0.1, "nope")


def test_kl_penalty_rewards_vs_naive_loop():
    g = torch.Generator().manual_seed(3)
    logp, ref = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    mask = (torch.rand(3, 4, generator=g) > 0.4).float()
    for name in KL_ESTIMATORS.names():
        out = kl_penalty_rewards(logp, ref, mask, 0.05, name)
        for i in range(3):
            for t in range(4):
                want = -0.05 * KL_ESTIMATORS.get(name)(logp[i, t], ref[i, t]).item() if mask[i, t] else 0.0
                assert out[i, t].item() == pytest.approx(want)


# ---------------------------------------------------------------- KL controllers


def test_fixed_controller():
    c = make_kl_controller(0.05, 0.0, 100)
    assert isinstance(c, FixedKLController) and c.value == 0.05
    c.update(10.0, 64)
    assert c.value == 0.05
    assert c.state_dict() == {"value": 0.05}
    with pytest.raises(ValueError, match="coefficient"):
        FixedKLController(-1.0)


def test_adaptive_controller_hand_sequence():
    c = make_kl_controller(0.1, 6.0, 10_000)
    assert isinstance(c, AdaptiveKLController)
    # KL 6.6 -> e = 0.1; beta = 0.1 * (1 + 0.1 * 100 / 10000) = 0.1 * 1.001
    c.update(6.6, 100)
    assert c.value == pytest.approx(0.1001)
    # KL 12 -> e = 1 clipped to 0.2; beta *= 1 + 0.2 * 500 / 10000 = 1.01
    c.update(12.0, 500)
    assert c.value == pytest.approx(0.1001 * 1.01)
    # KL 0 -> e = -1 clipped to -0.2; beta *= 1 - 0.2 * 1000 / 10000 = 0.98
    c.update(0.0, 1000)
    assert c.value == pytest.approx(0.1001 * 1.01 * 0.98)
    # on target: no change
    before = c.value
    c.update(6.0, 1000)
    assert c.value == pytest.approx(before)


def test_adaptive_controller_error_clip_and_naive():
    c = AdaptiveKLController(0.2, target=1.0, horizon=50)
    beta = 0.2
    for kl in [0.0, 0.5, 0.79, 0.81, 1.0, 1.19, 1.21, 3.0, 100.0]:
        c.update(kl, 5)
        e = kl / 1.0 - 1
        e = -0.2 if e < -0.2 else (0.2 if e > 0.2 else e)
        beta *= 1 + e * 5 / 50
        assert c.value == pytest.approx(beta)
    a, b = AdaptiveKLController(1.0, 1.0, 10), AdaptiveKLController(1.0, 1.0, 10)
    a.update(1e9, 1)
    b.update(1.2, 1)
    assert a.value == pytest.approx(1.02) and b.value == pytest.approx(1.02)  # KL 1e9 clipped at +0.2, as KL 1.2


def test_controller_state_round_trip():
    a = AdaptiveKLController(0.1, 2.0, 100)
    for kl in (3.0, 1.0, 2.5):
        a.update(kl, 10)
    b = make_kl_controller(0.1, 2.0, 100)
    b.load_state_dict(a.state_dict())
    assert b.value == a.value and b.state_dict() == a.state_dict()
    a.update(5.0, 10)
    b.update(5.0, 10)
    assert b.value == a.value
    f = FixedKLController(0.3)
    f.load_state_dict({"value": 0.3})
    assert f.value == 0.3


@pytest.mark.parametrize("args, match", [((-0.1, 1.0, 10), "coefficient"), ((0.1, 0.0, 10), "target"),
                                         ((0.1, 1.0, 0), "horizon")])
def test_adaptive_controller_validation(args, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveKLController(*args)


def test_make_kl_controller_rejects_negative_target():
    with pytest.raises(ValueError, match="target"):
        make_kl_controller(0.1, -1.0, 10)


# ---------------------------------------------------------------- PPO-penalty coefficient


def test_penalty_controller_doubling_halving_hand():
    # d_targ = 0.01: band (0.01 / 1.5, 0.015) = (0.00667, 0.015) (PPO §4)
    c = PenaltyCoefController(1.0, 0.01)
    c.update(0.001, 1)  # below d_targ / 1.5: halve
    assert c.value == 0.5
    c.update(0.006, 1)
    assert c.value == 0.25
    c.update(0.0067, 1)  # inside the band: unchanged
    c.update(0.01, 1)
    c.update(0.015, 1)  # the bound itself: unchanged
    assert c.value == 0.25
    c.update(0.0151, 1)  # above 1.5 d_targ: double
    assert c.value == 0.5
    c.update(10.0, 1000)  # one step per update, whatever n_steps
    assert c.value == 1.0


def test_penalty_controller_vs_naive_and_fixed():
    c, beta = PenaltyCoefController(0.3, 0.02), 0.3
    for d in [0.0, 0.013, 0.0134, 0.02, 0.03, 0.031, 1.0, 0.005]:
        c.update(d, 1)
        beta = beta / 2 if d < 0.02 / 1.5 else (beta * 2 if d > 0.02 * 1.5 else beta)
        assert c.value == pytest.approx(beta)
    f = PenaltyCoefController(0.3, 0.0)  # target 0: fixed beta
    for d in (0.0, 100.0):
        f.update(d, 1)
    assert f.value == 0.3


def test_penalty_controller_state_round_trip_and_validation():
    a = PenaltyCoefController(1.0, 0.01)
    for d in (0.0, 0.0, 0.5):
        a.update(d, 1)
    assert a.state_dict() == {"value": 0.5, "target": 0.01}
    b = PenaltyCoefController(0.0, 0.0)
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
    a.update(0.0, 1)
    b.update(0.0, 1)
    assert b.value == a.value == 0.25
    with pytest.raises(ValueError, match="coefficient"):
        PenaltyCoefController(-1.0, 0.01)
    with pytest.raises(ValueError, match="target"):
        PenaltyCoefController(1.0, -0.01)
