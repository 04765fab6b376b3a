import math
from types import SimpleNamespace

import pytest
import torch

from rlft.core.losses import (
    AGGREGATIONS,
    POLICY_LOSSES,
    aggregate,
    aggregate_parts,
    aggregation_weight,
    clip_loss,
    gspo_loss,
    kimi_omd_loss,
    positive_lm_loss,
    positive_lm_parts,
    ppo_penalty_loss,
    reinforce_loss,
    sft_loss,
)
from numerics import assert_rounding_close

DAPO = SimpleNamespace(clip_low=0.2, clip_high=0.28, clip_c=0.0)
DUAL = SimpleNamespace(clip_low=0.2, clip_high=0.2, clip_c=3.0)
METRIC_KEYS = {"pg_clipfrac", "pg_clipfrac_high", "pg_clipfrac_low", "pg_clipfrac_dual", "ppo_kl"}
LOSSES = ["clip", "gspo", "reinforce"]
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def _ratio_inputs(ratios, adv):
    r = torch.tensor(ratios, dtype=torch.float64)
    old = torch.zeros(1, len(ratios), dtype=torch.float64)
    logp = torch.log(r)[None].clone().requires_grad_(True)  # (1, T)
    adv = torch.full((1, len(ratios)), float(adv), dtype=torch.float64)
    return logp, old, adv, torch.ones(1, len(ratios))


# ---------------------------------------------------------------- policy loss: hand-computed


def test_registry():
    assert POLICY_LOSSES.get("clip") is clip_loss
    assert POLICY_LOSSES.get("gspo") is gspo_loss
    assert POLICY_LOSSES.get("reinforce") is reinforce_loss
    assert POLICY_LOSSES.get("ppo_penalty") is ppo_penalty_loss
    assert POLICY_LOSSES.get("kimi_omd") is kimi_omd_loss
    assert set(LOSSES) <= set(POLICY_LOSSES.names())
    assert set(MODES) <= set(AGGREGATIONS.names())


def test_clip_loss_hand():
    logp, old, adv, mask = _ratio_inputs([1.0, 1.5, 0.5], 2.0)
    loss, m = clip_loss(logp, old, adv, mask, DAPO)
    # A=2: r=1 -> -2; r=1.5 -> max(-3, -2.56) = -2.56; r=0.5 -> max(-1, -1.6) = -1
    torch.testing.assert_close(loss.detach(), torch.tensor([[-2.0, -2.56, -1.0]], dtype=torch.float64))
    assert m["pg_clipfrac"].item() == pytest.approx(1 / 3)
    assert m["pg_clipfrac_high"].item() == pytest.approx(1 / 3)
    assert m["pg_clipfrac_low"].item() == 0.0
    # ppo_kl is a float32 mean of terms that cancel (0, -0.41, +0.69): bound its rounding, not its relative error
    log_r = [0.0, math.log(1.5), math.log(0.5)]
    assert_rounding_close(m["ppo_kl"].item(), -sum(log_r) / 3, n_terms=3, scale=sum(map(abs, log_r)) / 3, what="ppo_kl")
    assert all(not v.requires_grad and v.dim() == 0 and v.is_floating_point() for v in m.values())


def test_clip_higher_gradient_positive_advantage():
    # bounds [0.8, 1.28]: for A > 0 the gradient vanishes exactly when r > 1.28
    ratios = [0.5, 0.79, 1.0, 1.27, 1.279, 1.281, 1.29, 2.0]
    logp, old, adv, mask = _ratio_inputs(ratios, 1.0)
    loss, m = clip_loss(logp, old, adv, mask, DAPO)
    loss.sum().backward()
    for r, gr in zip(ratios, logp.grad[0].tolist()):
        if r > 1.28:
            assert gr == 0.0
        else:
            assert gr == pytest.approx(-r)  # d(-A r)/d log r = -A r
    assert m["pg_clipfrac_high"].item() == pytest.approx(3 / 8)
    assert m["pg_clipfrac_low"].item() == 0.0


def test_clip_low_gradient_negative_advantage():
    ratios = [0.5, 0.79, 0.81, 1.0, 1.5, 3.0]
    logp, old, adv, mask = _ratio_inputs(ratios, -1.0)
    loss, m = clip_loss(logp, old, adv, mask, DAPO)
    loss.sum().backward()
    for r, gr in zip(ratios, logp.grad[0].tolist()):
        assert gr == (0.0 if r < 0.8 else pytest.approx(r))
    assert m["pg_clipfrac_low"].item() == pytest.approx(2 / 6)
    assert m["pg_clipfrac"].item() == pytest.approx(2 / 6)


def test_clip_log_ratio_clamped():
    logp = torch.tensor([[0.0, -1e4]])
    old = torch.tensor([[-1e4, 0.0]])
    loss, m = clip_loss(logp, old, torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2), DAPO)
    assert torch.isfinite(loss).all()
    assert loss[0, 0].item() == pytest.approx(math.exp(20.0), rel=1e-6)  # float32 exp is within 1 ulp (1.2e-7)


def test_clip_loss_vs_naive_loop():
    logp, old, adv, mask = _random_inputs(0)
    loss, m = clip_loss(logp, old, adv, mask, DAPO)
    clipped = 0
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            r = math.exp(logp[i, t].item() - old[i, t].item())
            a = adv[i, t].item()
            rc = min(max(r, 0.8), 1.28)
            want = max(-a * r, -a * rc) if mask[i, t] else 0.0
            clipped += int(bool(mask[i, t]) and -a * rc > -a * r)
            assert loss[i, t].item() == pytest.approx(want)
    assert clipped > 0  # the case exercises the clip
    assert m["pg_clipfrac"].item() == pytest.approx(clipped / mask.sum().item())


def test_clip_values_under_mask_change_nothing():
    g = torch.Generator().manual_seed(1)
    logp, old, adv = (torch.randn(2, 4, generator=g) for _ in range(3))
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    loss, m = clip_loss(logp, old, adv, mask, DAPO)
    junk = mask == 0
    logp2, old2, adv2 = logp.clone(), old.clone(), adv.clone()
    logp2[junk], old2[junk], adv2[junk] = -1e4, 1e4, float("nan")
    loss2, m2 = clip_loss(logp2, old2, adv2, mask, DAPO)
    torch.testing.assert_close(loss2, loss)
    for k in m:
        torch.testing.assert_close(m2[k], m[k])
    logp2.requires_grad_(True)
    clip_loss(logp2, old2, adv2, mask, DAPO)[0].sum().backward()
    assert torch.isfinite(logp2.grad).all() and (logp2.grad[junk] == 0).all()


# ---------------------------------------------------------------- every policy loss


def _random_inputs(seed, B=3, T=5, spread=0.3, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(B, T, generator=g, dtype=dtype) * spread - 1.0
    old = logp + torch.randn(B, T, generator=g, dtype=dtype) * spread
    adv = torch.randn(B, T, generator=g, dtype=dtype)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    mask[0, :2] = 1.0
    return logp, old, adv, mask


@pytest.mark.parametrize("name", LOSSES)
def test_every_loss_same_metric_keys(name):
    logp, old, adv, mask = _random_inputs(3)
    loss, m = POLICY_LOSSES.get(name)(logp.requires_grad_(True), old, adv, mask, DUAL)
    assert set(m) == METRIC_KEYS
    assert all(not v.requires_grad and v.dim() == 0 and v.is_floating_point() for v in m.values())
    assert loss.shape == logp.shape and (loss[mask == 0] == 0).all()


JUNK = [(float("nan"), float("inf"), float("nan")), (float("inf"), float("-inf"), float("-inf")), (-1e4, 1e4, 1e30)]


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("cfg", [DAPO, DUAL])
@pytest.mark.parametrize("junk", JUNK)
def test_every_loss_values_under_mask_change_nothing(name, cfg, junk):
    check_mask_invariance(POLICY_LOSSES.get(name), cfg, junk, seed=4)


def check_mask_invariance(fn, cfg, junk, seed: int) -> None:
    """Junk under mask 0 changes neither the loss, nor its metrics, nor the gradient (which is 0 there)."""
    logp, old, adv, mask = _random_inputs(seed, spread=1.0)
    logp.requires_grad_(True)
    loss, m = fn(logp, old, adv, mask, cfg)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    bad = mask == 0
    logp2, old2, adv2 = logp.detach().clone(), old.clone(), adv.clone()
    logp2[bad], old2[bad], adv2[bad] = junk
    logp2.requires_grad_(True)
    loss2, m2 = fn(logp2, old2, adv2, mask, cfg)
    torch.testing.assert_close(loss2, loss)
    for k in m:
        torch.testing.assert_close(m2[k], m[k])
    loss2.sum().backward()
    torch.testing.assert_close(logp2.grad, grad)
    assert (logp2.grad[bad] == 0).all()


# ---------------------------------------------------------------- clip: dual-clip, clip-higher


def test_dual_clip_hand():
    # A = -1, eps = 0.2, c = 3: loss = min(max(r, clip(r)), 3)
    ratios = [0.5, 1.0, 2.0, 3.5, 5.0]
    logp, old, adv, mask = _ratio_inputs(ratios, -1.0)
    loss, m = clip_loss(logp, old, adv, mask, DUAL)
    torch.testing.assert_close(loss.detach(), torch.tensor([[0.8, 1.0, 2.0, 3.0, 3.0]], dtype=torch.float64))
    assert m["pg_clipfrac_dual"].item() == pytest.approx(2 / 5)
    assert m["pg_clipfrac"].item() == pytest.approx(1 / 5)  # r = 0.5: the PPO clip
    assert m["pg_clipfrac_low"].item() == pytest.approx(1 / 5)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 1.0, 2.0, 0.0, 0.0]], dtype=torch.float64))
    # the cap never touches A > 0, nor does it change anything with clip_c = 0
    logp, old, adv, mask = _ratio_inputs([5.0], 1.0)
    loss, m = clip_loss(logp, old, adv, mask, DUAL)
    assert loss.item() == pytest.approx(-1.2) and m["pg_clipfrac_dual"].item() == 0.0
    logp, old, adv, mask = _ratio_inputs([5.0], -1.0)
    assert clip_loss(logp, old, adv, mask, DAPO)[0].item() == pytest.approx(5.0)


def test_dual_clip_vs_naive_loop():
    logp, old, adv, mask = _random_inputs(5, B=4, T=6, spread=1.0)
    loss, m = clip_loss(logp, old, adv, mask, DUAL)
    n_dual = 0
    for i in range(4):
        for t in range(6):
            r = math.exp(logp[i, t].item() - old[i, t].item())
            a = adv[i, t].item()
            want = max(-a * r, -a * min(max(r, 0.8), 1.2))
            if a < 0 and want > -3.0 * a:
                want = -3.0 * a
                n_dual += int(bool(mask[i, t]))
            assert loss[i, t].item() == pytest.approx(want if mask[i, t] else 0.0)
    assert n_dual > 0
    assert m["pg_clipfrac_dual"].item() == pytest.approx(n_dual / mask.sum().item())


@pytest.mark.parametrize("clip_c", [0.5, 1.0, -3.0])
def test_dual_clip_constant_validated(clip_c):
    logp, old, adv, mask = _ratio_inputs([1.0], -1.0)
    for name in ("clip", "gspo"):
        with pytest.raises(ValueError, match="clip_c"):
            POLICY_LOSSES.get(name)(logp, old, adv, mask, SimpleNamespace(clip_low=0.2, clip_high=0.2, clip_c=clip_c))


def test_clip_higher_probability_bound():
    # pi_old = 0.01 and 0.9, A > 0: pi may rise to (1 + eps_high) * pi_old before the gradient vanishes
    assert (1 + 0.2) * 0.01 == pytest.approx(0.012) and (1 + 0.2) * 0.9 == pytest.approx(1.08)
    assert (1 + 0.28) * 0.01 == pytest.approx(0.0128)  # clip-higher lets the rare token grow further

    def grad_at(pi, pi_old, eps_high):
        logp = torch.tensor([[math.log(pi)]], dtype=torch.float64, requires_grad=True)
        old = torch.tensor([[math.log(pi_old)]], dtype=torch.float64)
        cfg = SimpleNamespace(clip_low=0.2, clip_high=eps_high, clip_c=0.0)
        clip_loss(logp, old, torch.ones(1, 1, dtype=torch.float64), torch.ones(1, 1), cfg)[0].sum().backward()
        return logp.grad.item()

    for pi, zero_at_02, zero_at_028 in [(0.0119, False, False), (0.0121, True, False), (0.0127, True, False),
                                        (0.0129, True, True)]:
        assert (grad_at(pi, 0.01, 0.2) == 0.0) is zero_at_02, pi
        assert (grad_at(pi, 0.01, 0.28) == 0.0) is zero_at_028, pi
        if not zero_at_02:
            assert grad_at(pi, 0.01, 0.2) == pytest.approx(-pi / 0.01)  # -A r
    for pi in (0.95, 0.999, 1.0):  # the bound 1.08 > 1 is out of reach: the likely token is never clipped
        assert grad_at(pi, 0.9, 0.2) == pytest.approx(-pi / 0.9)


# ---------------------------------------------------------------- gspo


def test_gspo_tutorial_example():
    # token ratios 2.0 and 0.4, A = 1, eps = 0.2
    cfg = SimpleNamespace(clip_low=0.2, clip_high=0.2, clip_c=0.0)
    logp, old, adv, mask = _ratio_inputs([2.0, 0.4], 1.0)
    loss, m = gspo_loss(logp, old, adv, mask, cfg)
    s = math.exp((math.log(2.0) + math.log(0.4)) / 2)
    assert s == pytest.approx(0.894, abs=5e-4)
    torch.testing.assert_close(loss.detach(), torch.full((1, 2), -s, dtype=torch.float64))  # inside [0.8, 1.2]
    assert -aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(s)  # float64
    assert m["pg_clipfrac"].item() == 0.0
    # token-level clipping of the ratios instead: (1.2 + 0.8) / 2 = 1.0
    assert torch.tensor([2.0, 0.4]).clamp(0.8, 1.2).mean().item() == pytest.approx(1.0)
    # (PPO's min(r A, clip(r) A) per token would give (1.2 + 0.4) / 2 = 0.8)
    ppo, _ = clip_loss(logp, old, adv, mask, cfg)
    assert -aggregate(ppo, mask, "seq-mean-token-mean").item() == pytest.approx(0.8)


def test_gspo_sequence_log_ratio_clamped_and_the_gradient_still_reaches_every_token():
    """log s_i = mean(30, 30) = 30 is clamped to LOG_RATIO_CLAMP = 20 (only the detached sg[log s_i]); with A = -1
    and no dual clip the unclipped branch wins: each token's loss is e^20 and its gradient d/dlogp_t is e^20 (not
    0, as a clamp on the tensor carrying the gradient would give). The second sequence (log s = 0.5) is untouched."""
    logp = torch.tensor([[30.0, 30.0], [0.5, 0.5]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(2, 2, dtype=torch.float64)
    adv = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
    loss, _ = gspo_loss(logp, old, adv, torch.ones(2, 2), DAPO)
    loss.sum().backward()
    big = math.exp(20.0)
    assert loss[0].tolist() == pytest.approx([big, big], rel=1e-12)
    assert logp.grad[0].tolist() == pytest.approx([big, big], rel=1e-12)
    assert loss[1].tolist() == pytest.approx([math.exp(0.5)] * 2, rel=1e-12)
    assert logp.grad[1].tolist() == pytest.approx([math.exp(0.5)] * 2, rel=1e-12)


def _gspo_direct(logp, old, adv_seq, mask, lo, hi):
    """-mean_i min(s_i A_i, clip(s_i) A_i) over non-empty sequences, straight from GSPO eq. 5 and 7."""
    terms = []
    for i in range(logp.shape[0]):
        n = int(mask[i].sum())
        if n == 0:
            continue
        s = torch.exp(sum(logp[i, t] - old[i, t] for t in range(logp.shape[1]) if mask[i, t]) / n)
        terms.append(torch.minimum(s * adv_seq[i], s.clamp(lo, hi) * adv_seq[i]))
    return -torch.stack(terms).mean()


def test_gspo_value_and_gradient_equal_sequence_objective():
    g = torch.Generator().manual_seed(6)
    B, T = 8, 5
    logp = (torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3 - 1.0).requires_grad_(True)
    old = logp.detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    adv_seq = torch.randn(B, generator=g, dtype=torch.float64)
    adv = adv_seq[:, None].expand(B, T)  # (B, T)  sequence-constant (GRPO)
    lengths = torch.tensor([5, 3, 1, 0, 4, 2, 5, 3])
    mask = (torch.arange(T)[None] < lengths[:, None]).float()  # (B, T)
    mat, m = gspo_loss(logp, old, adv, mask, DAPO)
    ours = aggregate(mat, mask, "seq-mean-token-mean")
    direct = _gspo_direct(logp, old, adv_seq, mask, 0.8, 1.28)
    assert ours.item() == pytest.approx(direct.item())
    (g_ours,) = torch.autograd.grad(ours, logp)
    (g_direct,) = torch.autograd.grad(direct, logp)
    torch.testing.assert_close(g_ours, g_direct)
    assert 0 < m["pg_clipfrac"].item() < 1  # both regimes are exercised


def test_gspo_vs_naive_loop_and_clip_metrics():
    # two sequences: s = 0.894 (inside), s = 2 on one token (A > 0: clipped high)
    logp = torch.log(torch.tensor([[2.0, 0.4], [2.0, 9.0]], dtype=torch.float64))
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, m = gspo_loss(logp, torch.zeros(2, 2, dtype=torch.float64), torch.ones(2, 2, dtype=torch.float64), mask, DUAL)
    s = math.sqrt(0.8)
    torch.testing.assert_close(loss, torch.tensor([[-s, -s], [-1.2, 0.0]], dtype=torch.float64))
    assert m["pg_clipfrac"].item() == pytest.approx(1 / 3)  # token-weighted: the clipped sequence has 1 token
    assert m["pg_clipfrac_high"].item() == pytest.approx(1 / 3)
    # naive loop on random data, per-token advantages (GSPO-token)
    logp, old, adv, mask = _random_inputs(7, B=4, T=6, spread=0.5)
    loss, _ = gspo_loss(logp, old, adv, mask, DUAL)
    for i in range(4):
        idx = [t for t in range(6) if mask[i, t]]
        s = math.exp(sum(logp[i, t].item() - old[i, t].item() for t in idx) / max(len(idx), 1))
        for t in range(6):
            a = adv[i, t].item()
            want = min(max(-a * s, -a * min(max(s, 0.8), 1.2)), -3.0 * a if a < 0 else math.inf)
            assert loss[i, t].item() == pytest.approx(want if mask[i, t] else 0.0)


def test_gspo_dual_clip():
    logp, old, adv, mask = _ratio_inputs([5.0, 5.0], -1.0)
    loss, m = gspo_loss(logp, old, adv, mask, DUAL)
    torch.testing.assert_close(loss.detach(), torch.full((1, 2), 3.0, dtype=torch.float64))
    assert m["pg_clipfrac_dual"].item() == 1.0
    loss.sum().backward()
    assert (logp.grad == 0).all()


# ---------------------------------------------------------------- reinforce


def test_reinforce_hand():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, 0.0]])
    adv = torch.tensor([[2.0, -1.0, 7.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, m = reinforce_loss(logp, old, adv, mask, DAPO)
    torch.testing.assert_close(loss.detach(), torch.tensor([[2.0, -2.0, 0.0]]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.0, 1.0, 0.0]]))  # d(-A logp)/dlogp = -A
    assert all(m[k].item() == 0.0 for k in METRIC_KEYS - {"ppo_kl"})
    assert m["ppo_kl"].item() == pytest.approx(-0.25)


def test_reinforce_gradient_equals_on_policy_clip_gradient():
    # at r = 1 (old = logp) the clipped surrogate's gradient is -A, the policy gradient
    logp, _, adv, mask = _random_inputs(8)
    grads = []
    for name in ("reinforce", "clip", "gspo"):
        x = logp.clone().requires_grad_(True)
        POLICY_LOSSES.get(name)(x, logp, adv, mask, DUAL)[0].sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(grads[0], torch.where(mask != 0, -adv, torch.zeros_like(adv)))
    # gspo at s = 1: gradient -A as well (per token, before aggregation)
    torch.testing.assert_close(grads[2], grads[0])


# ---------------------------------------------------------------- PPO-penalty (PPO §4, eq. 8)

PENALTY = SimpleNamespace(penalty_coef=0.5, omd_tau=0.4)


def test_ppo_penalty_hand():
    # r = 2, A = 1, beta = 0.5: -2 + 0.5 (2 - 1 - log 2); r = 0.5, A = -1: 0.5 + 0.5 (0.5 - 1 + log 2); r = 1: -A
    logp, old, _, mask = _ratio_inputs([2.0, 0.5, 1.0], 0.0)
    adv = torch.tensor([[1.0, -1.0, 3.0]], dtype=torch.float64)
    loss, m = ppo_penalty_loss(logp, old, adv, mask, PENALTY)
    kl = [1 - math.log(2), -0.5 + math.log(2), 0.0]
    want = [-2 + 0.5 * kl[0], 0.5 + 0.5 * kl[1], -3.0]
    torch.testing.assert_close(loss.detach(), torch.tensor([want], dtype=torch.float64))
    assert m["ppo_penalty_kl"].item() == pytest.approx(sum(kl) / 3)
    assert set(m) == METRIC_KEYS | {"ppo_penalty_kl"} and all(m[k].item() == 0 for k in METRIC_KEYS - {"ppo_kl"})
    # d/dlog r of -A r + beta (r - 1 - log r) = -A r + beta (r - 1)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2 + 0.5, 0.5 - 0.25, -3.0]], dtype=torch.float64))


def test_ppo_penalty_vs_naive_loop():
    logp, old, adv, mask = _random_inputs(11, B=4, T=6, spread=1.0)
    loss, m = ppo_penalty_loss(logp, old, adv, mask, PENALTY)
    kls = []
    for i in range(4):
        for t in range(6):
            lr = logp[i, t].item() - old[i, t].item()
            kl = math.exp(lr) - 1 - lr
            want = -adv[i, t].item() * math.exp(lr) + 0.5 * kl if mask[i, t] else 0.0
            kls += [kl] if mask[i, t] else []
            assert loss[i, t].item() == pytest.approx(want)
    assert m["ppo_penalty_kl"].item() == pytest.approx(sum(kls) / len(kls))


def test_ppo_penalty_kl_estimates_kl_old_new():
    # tokens drawn from pi_old: the mean k3 term is KL(pi_old || pi) exactly in expectation (no sampling here)
    old = torch.log(torch.tensor([[0.5, 0.2, 0.2, 0.1]], dtype=torch.float64))
    new = torch.log(torch.tensor([[0.3, 0.3, 0.3, 0.1]], dtype=torch.float64))
    zero_adv = torch.zeros_like(old)
    loss, _ = ppo_penalty_loss(new, old, zero_adv, torch.ones_like(old), SimpleNamespace(penalty_coef=1.0))
    exact = (old.exp() * (old - new)).sum().item()
    assert (old.exp() * loss).sum().item() == pytest.approx(exact)


# ---------------------------------------------------------------- Kimi k1.5 online mirror descent (§2.3.2)


def test_kimi_omd_hand():
    # one sequence, 2 valid tokens: logp (-1, -2), old (-1.5, -2.5) -> L = 1; A = 2; tau = 0.4
    logp = torch.tensor([[-1.0, -2.0, 5.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.5, -2.5, 0.0]], dtype=torch.float64)
    adv = torch.full((1, 3), 2.0, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    loss, m = kimi_omd_loss(logp, old, adv, mask, PENALTY)
    # per token -A logp + (tau/2) L^2 / 2 = (2 + 0.1, 4 + 0.1, 0)
    torch.testing.assert_close(loss.detach(), torch.tensor([[2.1, 4.1, 0.0]], dtype=torch.float64))
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx(-2 * -3.0 + 0.2 * 1.0)
    loss.sum().backward()  # d/dlogp_t = -A + tau L = -2 + 0.4
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.6, -1.6, 0.0]], dtype=torch.float64))
    assert set(m) == METRIC_KEYS and m["ppo_kl"].item() == pytest.approx(-0.5)


def test_kimi_omd_gradient_vs_naive_per_sequence():
    # (1/k) sum_j [-(r_j - rbar) log pi(y_j) + (tau/2) (log pi(y_j) - log pi_old(y_j))^2], sequence by sequence
    logp, old, _, mask = _random_inputs(12, B=5, T=6, spread=0.5)
    mask[2] = 0.0  # an empty sequence: excluded from the mean
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    adv = (r - r.mean())[:, None].expand(5, 6).clone()  # group_mean: A_t = r_j - rbar
    x = logp.clone().requires_grad_(True)
    loss = aggregate(kimi_omd_loss(x, old, adv, mask, PENALTY)[0], mask, "seq-mean-token-sum")
    (grad,) = torch.autograd.grad(loss, x)
    y = logp.clone().requires_grad_(True)
    terms = []
    for j in range(5):
        if mask[j].sum() == 0:
            continue
        seq_logp = sum(y[j, t] for t in range(6) if mask[j, t])
        seq_old = sum(old[j, t].item() for t in range(6) if mask[j, t])
        terms.append(-adv[j, 0] * seq_logp + 0.5 * 0.4 * (seq_logp - seq_old) ** 2)
    naive = sum(terms) / len(terms)
    (naive_grad,) = torch.autograd.grad(naive, y)
    assert loss.item() == pytest.approx(naive.item())
    torch.testing.assert_close(grad, naive_grad)


@pytest.mark.parametrize("name", ["ppo_penalty", "kimi_omd"])
@pytest.mark.parametrize("junk", JUNK)
def test_penalty_losses_values_under_mask_change_nothing(name, junk):
    check_mask_invariance(POLICY_LOSSES.get(name), PENALTY, junk, seed=13)


def test_penalty_losses_on_policy_gradient_is_reinforce():
    # at pi = pi_old both penalties vanish with their gradients: -A, the policy gradient
    logp, _, adv, mask = _random_inputs(14)
    want = torch.where(mask != 0, -adv, torch.zeros_like(adv))
    for name in ("ppo_penalty", "kimi_omd"):
        x = logp.clone().requires_grad_(True)
        POLICY_LOSSES.get(name)(x, logp, adv, mask, PENALTY)[0].sum().backward()
        torch.testing.assert_close(x.grad, want)


# ---------------------------------------------------------------- aggregation


@pytest.fixture
def ragged():
    nan = float("nan")
    loss = torch.tensor(
        [[1.0, 2.0, 3.0, nan], [4.0, 9.0, 9.0, 9.0], [7.0, 7.0, 7.0, 7.0], [2.0, 2.0, 2.0, 2.0]], dtype=torch.float64
    )
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    return loss, mask


def test_aggregations_hand(ragged):
    loss, mask = ragged  # lengths 3, 1, 0, 4; sums 6, 4, -, 8
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(18 / 8)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4 + 2) / 3)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4 + 8) / 3)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", max_len=5).item() == pytest.approx(18 / (4 * 5))


def test_sum_norm_needs_max_len(ragged):
    with pytest.raises(ValueError, match="max_len"):
        aggregate(*ragged, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        aggregate(*ragged, "seq-mean-token-sum-norm", max_len=0)
    with pytest.raises(KeyError, match="token-mean"):
        aggregate(*ragged, "nope")


def _naive_aggregate(loss, mask, mode, max_len):
    rows = [[loss[i, t].item() for t in range(loss.shape[1]) if mask[i, t]] for i in range(loss.shape[0])]
    nonempty = [r for r in rows if r]
    if mode == "token-mean":
        return sum(map(sum, rows)) / sum(map(len, rows))
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in nonempty) / len(nonempty)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in nonempty) / len(nonempty)
    return sum(map(sum, rows)) / (len(rows) * max_len)


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_vs_naive_and_microbatches(mode):
    g = torch.Generator().manual_seed(2)
    B, T = 10, 7
    loss = torch.randn(B, T, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = 3
    mask = (torch.arange(T)[None] < lengths[:, None]).float()  # (B, T)
    full = aggregate(loss, mask, mode, max_len=T)
    assert full.item() == pytest.approx(_naive_aggregate(loss.detach(), mask, mode, T))

    # micro-batches of uneven size: sum(num) / sum(den) == full-batch value, gradients too
    (grad_full,) = torch.autograd.grad(full, loss)
    splits = [(0, 3), (3, 4), (4, 9), (9, 10)]
    total = sum(aggregation_weight(mask[a:b], mode, max_len=T) for a, b in splits)
    value = 0.0
    for a, b in splits:
        num, den = aggregate_parts(loss[a:b], mask[a:b], mode, max_len=T)
        assert den.item() == aggregation_weight(mask[a:b], mode, max_len=T).item()
        (num / total).backward()
        value += (num / total).item()
    assert value == pytest.approx(full.item())
    torch.testing.assert_close(loss.grad, grad_full)


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_values_under_mask_change_nothing(mode, ragged):
    loss, mask = ragged
    other = loss.clone()
    other[mask == 0] = 1e30
    assert aggregate(other, mask, mode, max_len=4).item() == pytest.approx(aggregate(loss, mask, mode, max_len=4).item())


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_empty_mask_is_zero(mode):
    loss = torch.ones(2, 3, requires_grad=True)
    out = aggregate(loss, torch.zeros(2, 3), mode, max_len=3)
    out.backward()
    assert out.item() == 0.0 and torch.isfinite(loss.grad).all()


# ---------------------------------------------------------------- sft


def test_sft_loss_hand():
    logp = torch.tensor([[-1.0, -2.0, -50.0], [-3.0, -50.0, -50.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert sft_loss(logp, mask).item() == pytest.approx(2.0)


# ---------------------------------------------------------------- positive-sample LM loss (VAPO eq. 9)


def test_positive_lm_hand():
    nan = float("nan")
    logp = torch.tensor([[-1.0, -2.0, -50.0], [-3.0, -4.0, -5.0], [-0.5, nan, nan]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    positive = torch.tensor([True, False, True])
    num, den = positive_lm_parts(logp, mask, positive)
    assert (num.item(), den.item()) == (pytest.approx(3.5), 3.0)
    assert positive_lm_loss(logp, mask, positive).item() == pytest.approx(3.5 / 3)


def test_positive_lm_microbatches_add_up_and_match_naive():
    g = torch.Generator().manual_seed(9)
    B, T = 7, 4
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    positive = torch.tensor([1, 0, 1, 1, 0, 0, 1]).bool()
    full = positive_lm_loss(logp, mask, positive)
    toks = [-logp[i, t].item() for i in range(B) for t in range(T) if positive[i] and mask[i, t]]
    assert full.item() == pytest.approx(sum(toks) / len(toks))
    (grad_full,) = torch.autograd.grad(full, logp)
    parts = [positive_lm_parts(logp[a:b], mask[a:b], positive[a:b]) for a, b in [(0, 2), (2, 3), (3, 7)]]
    total = sum(den for _, den in parts)
    assert total.item() == len(toks)
    sum(num / total for num, _ in parts).backward()
    torch.testing.assert_close(logp.grad, grad_full)


def test_positive_lm_junk_and_no_positive():
    logp = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], requires_grad=True)
    mask = torch.tensor([[1, 0], [1, 1]])
    base = positive_lm_loss(logp, mask, torch.tensor([True, False]))
    junk = logp.detach().clone()
    junk[0, 1], junk[1] = float("nan"), float("-inf")  # under the mask, and in a negative sample
    junk.requires_grad_(True)
    out = positive_lm_loss(junk, mask, torch.tensor([True, False]))
    assert out.item() == base.item() == 1.0
    out.backward()
    assert torch.isfinite(junk.grad).all() and junk.grad[0, 0].item() == -1.0
    empty = positive_lm_loss(logp, mask, torch.tensor([False, False]))
    empty.backward()
    assert empty.item() == 0.0 and torch.isfinite(logp.grad).all()
