"""The 2025 policy losses (rlft.core.trust_region), the token-sum aggregation and top-entropy masking.

Each loss: a hand-computed case, an equivalence to a naive loop over tokens (value and gradient, float64),
the invariance of loss, metrics and gradient to values under mask 0, and parity with verl's formulas
(re-derived here from verl's documented definitions, float64; ``_verl_*``).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlft.core.losses import AGGREGATIONS, POLICY_LOSSES, aggregate, aggregate_parts, aggregation_weight, \
    top_entropy_mask
from test_losses import JUNK, METRIC_KEYS, _random_inputs, check_mask_invariance

NEW = ["cispo", "sapo", "gmpo", "dppo_tv", "dppo_kl", "clip_cov", "kl_cov"]
EXTRA_KEYS = {"sapo": {"sapo_gate"}, "clip_cov": {"cov_clipfrac"}, "kl_cov": {"cov_klfrac"}}


def cfg(**kw):
    base = dict(clip_low=0.2, clip_high=0.28, clip_c=0.0, sapo_tau_pos=1.0, sapo_tau_neg=1.05, clip_cov_ratio=0.25,
                clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.25, kl_cov_coef=1.0)
    return SimpleNamespace(**{**base, **kw})


def _f64(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def _grad(loss_fn, logp, old, adv, mask, c, agg=None):
    logp = logp.clone().requires_grad_(True)
    loss, m = loss_fn(logp, old, adv, mask, c)
    total = loss.sum() if agg is None else aggregate(loss, mask, agg)
    (g,) = torch.autograd.grad(total, logp)
    return loss.detach(), g, m


def _seeded(fn, seed=0):
    def go(*args):
        torch.manual_seed(seed)
        return fn(*args)

    return go


# ---------------------------------------------------------------- shared: keys, mask invariance


@pytest.mark.parametrize("name", NEW)
def test_registered_with_the_common_metric_keys(name):
    logp, old, adv, mask = _random_inputs(3)
    loss, m = _seeded(POLICY_LOSSES.get(name))(logp.requires_grad_(True), old, adv, mask, cfg(clip_c=3.0))
    assert set(m) == METRIC_KEYS | EXTRA_KEYS.get(name, set())
    assert all(not v.requires_grad and v.dim() == 0 and v.is_floating_point() for v in m.values())
    assert loss.shape == logp.shape and (loss[mask == 0] == 0).all()


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("junk", JUNK)
def test_values_under_mask_change_nothing(name, junk):
    c = cfg(clip_c=3.0 if name.startswith("dppo") else 0.0, clip_cov_lb=-1.0, clip_cov_ub=1.0, clip_cov_ratio=0.3)
    check_mask_invariance(_seeded(POLICY_LOSSES.get(name)), c, junk, seed=4)


# ---------------------------------------------------------------- CISPO


def test_cispo_hand():
    # MiniMax-M1 eq. 4-5: loss = -sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp; eps_low 1.0 (no lower bound), eps_high 0.28
    r = [1.0, 1.5, 0.5]
    logp, old, adv, mask = _f64([math.log(x) for x in r]), _f64([0.0] * 3), _f64([2.0] * 3), torch.ones(1, 3)
    loss, g, m = _grad(POLICY_LOSSES.get("cispo"), logp, old, adv, mask, cfg(clip_low=1.0))
    # weights 1, 1.28, 0.5: loss -1*2*0 = 0, -1.28*2*log 1.5 = -1.037990, -0.5*2*log 0.5 = +0.693147
    torch.testing.assert_close(loss, _f64([0.0, -2.56 * math.log(1.5), -math.log(0.5)]))
    torch.testing.assert_close(g, _f64([-2.0, -2.56, -1.0]))  # -w A: every token keeps its gradient
    assert m["pg_clipfrac"].item() == pytest.approx(1 / 3) and m["pg_clipfrac_high"].item() == pytest.approx(1 / 3)


def test_cispo_vs_naive_loop():
    logp, old, adv, mask = _random_inputs(5)
    c = cfg(clip_low=0.3, clip_high=0.25)
    loss, g, _ = _grad(POLICY_LOSSES.get("cispo"), logp, old, adv, mask, c)
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[i, t]:
                assert loss[i, t] == 0 and g[i, t] == 0
                continue
            w = min(max(math.exp(logp[i, t] - old[i, t]), 1 - 0.3), 1 + 0.25)
            assert loss[i, t].item() == pytest.approx(-w * adv[i, t].item() * logp[i, t].item(), rel=1e-12, abs=1e-12)
            assert g[i, t].item() == pytest.approx(-w * adv[i, t].item(), rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------- SAPO


def test_sapo_hand():
    # SAPO gate f(r) = sigmoid(tau (r - 1)) 4 / tau, loss -f(r) A; tau_pos 1.0 (A > 0), tau_neg 1.05 (A < 0)
    logp, old = _f64([0.0, 0.5, 0.0]), _f64([0.0, 0.0, 0.0])
    adv, mask = _f64([1.0, 1.0, -1.0]), torch.ones(1, 3)
    loss, g, m = _grad(POLICY_LOSSES.get("sapo"), logp, old, adv, mask, cfg())
    s = 1 / (1 + math.exp(-(math.exp(0.5) - 1)))  # sigmoid(0.6487) = 0.656717
    torch.testing.assert_close(loss, _f64([-2.0, -4 * s, 2 / 1.05]))  # r = 1: gate 2 / tau
    # d loss / d logp = -A 4 sigma (1 - sigma) r: exactly -A on-policy, whatever tau
    torch.testing.assert_close(g, _f64([-1.0, -4 * s * (1 - s) * math.exp(0.5), 1.0]))
    assert m["pg_clipfrac"].item() == 0.0


def test_sapo_vs_naive_loop():
    logp, old, adv, mask = _random_inputs(6)
    c = cfg(sapo_tau_pos=0.7, sapo_tau_neg=1.3)
    loss, g, _ = _grad(POLICY_LOSSES.get("sapo"), logp, old, adv, mask, c)
    for i, t in zip(*torch.nonzero(mask, as_tuple=True)):
        a, r = adv[i, t].item(), math.exp(logp[i, t] - old[i, t])
        tau = 0.7 if a > 0 else 1.3
        s = 1 / (1 + math.exp(-tau * (r - 1)))
        assert loss[i, t].item() == pytest.approx(-s * 4 / tau * a, rel=1e-12, abs=1e-12)
        assert g[i, t].item() == pytest.approx(-a * 4 * s * (1 - s) * r, rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------- GMPO


def test_gmpo_hand():
    # GMPO: s = exp(mean_t c_t), c clipped in log space to [-0.4, 0.4] on A's side; seq loss -A s
    old = _f64([0.0] * 3, [0.0] * 3)
    logp = _f64([0.5, -0.1, 0.2], [-0.5, 0.1, 0.3]) - 2.0
    old = old - 2.0
    adv, mask = _f64([1.0] * 3, [-1.0] * 3), torch.ones(2, 3)
    loss, g, m = _grad(POLICY_LOSSES.get("gmpo"), logp, old, adv, mask, cfg(clip_low=0.4, clip_high=0.4),
                       agg="seq-mean-token-mean")
    s0 = math.exp((0.4 - 0.1 + 0.2) / 3)  # A > 0: 0.5 -> 0.4 (clipped), 1.18136
    s1 = math.exp((-0.4 + 0.1 + 0.3) / 3)  # A < 0: -0.5 -> -0.4 (clipped), 1.0
    torch.testing.assert_close(loss, _f64([-s0] * 3, [s1] * 3))
    # mean over the 2 sequences of -A_i s_i; d/dlogp_t = -A s / n / 2 where unclipped, 0 where clipped
    torch.testing.assert_close(g, _f64([0.0, -s0 / 6, -s0 / 6], [0.0, s1 / 6, s1 / 6]))
    assert m["pg_clipfrac"].item() == pytest.approx(2 / 6)
    assert m["pg_clipfrac_high"].item() == pytest.approx(1 / 6) and m["pg_clipfrac_low"].item() == pytest.approx(1 / 6)


def _seq_adv_inputs(seed):
    logp, old, adv, mask = _random_inputs(seed, spread=0.6)
    return logp, old, adv[:, :1].expand_as(adv).clone(), mask  # sequence-constant advantage


def test_gmpo_vs_naive_loop():
    logp, old, adv, mask = _seq_adv_inputs(7)
    c = cfg(clip_low=0.3, clip_high=0.25)
    lp = logp.clone().requires_grad_(True)
    loss, _ = POLICY_LOSSES.get("gmpo")(lp, old, adv, mask, c)
    (g,) = torch.autograd.grad(aggregate(loss, mask, "seq-mean-token-mean"), lp)
    lp2 = logp.clone().requires_grad_(True)
    seqs = []
    for i in range(logp.shape[0]):
        cs = []
        for t in range(logp.shape[1]):
            if mask[i, t]:
                x = lp2[i, t] - old[i, t]
                a = adv[i, t].item()
                cs.append(torch.clamp(x, max=0.25) if a > 0 else torch.clamp(x, min=-0.3) if a < 0 else x * 0)
        if cs:
            seqs.append(-adv[i, 0] * torch.exp(sum(cs) / len(cs)))
    naive = sum(seqs) / len(seqs)
    (g2,) = torch.autograd.grad(naive, lp2)
    assert aggregate(loss.detach(), mask, "seq-mean-token-mean").item() == pytest.approx(naive.item(), rel=1e-12)
    torch.testing.assert_close(g, g2, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- DPPO


def test_dppo_tv_hand():
    # DPPO-Binary-TV, delta 0.15: (p, q) = (0.5, 0.3) A>0 leaves (0.2 > 0.15); (0.4, 0.3) stays;
    # (0.1, 0.3) A<0 leaves (-0.2 < -0.15); (0.2, 0.3) stays.  loss = -A sg(p/q) log p inside, 0 outside.
    p, q = [0.5, 0.4, 0.1, 0.2], [0.3, 0.3, 0.3, 0.3]
    logp, old = _f64([math.log(x) for x in p]), _f64([math.log(x) for x in q])
    adv, mask = _f64([1.0, 1.0, -1.0, -1.0]), torch.ones(1, 4)
    loss, g, m = _grad(POLICY_LOSSES.get("dppo_tv"), logp, old, adv, mask, cfg(clip_low=0.15, clip_high=0.15))
    torch.testing.assert_close(loss, _f64([0.0, -(0.4 / 0.3) * math.log(0.4), 0.0, (0.2 / 0.3) * math.log(0.2)]))
    torch.testing.assert_close(g, _f64([0.0, -0.4 / 0.3, 0.0, 0.2 / 0.3]))  # PPO's gradient -A r inside the region
    assert m["pg_clipfrac"].item() == 0.5 and m["pg_clipfrac_high"].item() == 0.25


def test_dppo_kl_hand():
    # KL(Bern(0.3) || Bern(0.5)) = 0.3 ln(0.3/0.5) + 0.7 ln(0.7/0.5) = 0.08228 > 0.05: masked for A > 0 only;
    # KL(Bern(0.3) || Bern(0.35)) = 0.00563 <= 0.05: kept
    kl = 0.3 * math.log(0.3 / 0.5) + 0.7 * math.log(0.7 / 0.5)
    assert kl == pytest.approx(0.082283, abs=1e-6)
    p, q = [0.5, 0.35, 0.5], [0.3, 0.3, 0.3]
    logp, old = _f64([math.log(x) for x in p]), _f64([math.log(x) for x in q])
    adv, mask = _f64([1.0, 1.0, -1.0]), torch.ones(1, 3)
    loss, g, _ = _grad(POLICY_LOSSES.get("dppo_kl"), logp, old, adv, mask, cfg(clip_low=0.05, clip_high=0.05))
    # the A < 0 token moved up (p >= q): the region does not bind in that direction
    torch.testing.assert_close(g, _f64([0.0, -0.35 / 0.3, 0.5 / 0.3]))
    torch.testing.assert_close(loss, _f64([0.0, -(0.35 / 0.3) * math.log(0.35), (0.5 / 0.3) * math.log(0.5)]))


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_vs_naive_loop_and_cap(name):
    logp, old, adv, mask = _random_inputs(8, spread=0.5)
    logp, old = logp - 3.0, old - 3.0  # log-probabilities: p, q in (0, 1)
    assert logp.max() < 0 and old.max() < 0
    c = cfg(clip_low=0.05, clip_high=0.08, clip_c=1.3)
    loss, g, m = _grad(POLICY_LOSSES.get(name), logp, old, adv, mask, c)
    n_cap = 0
    for i, t in zip(*torch.nonzero(mask, as_tuple=True)):
        lp, lq, a = logp[i, t].item(), old[i, t].item(), adv[i, t].item()
        p, q = math.exp(lp), math.exp(lq)
        if name == "dppo_tv":
            inside = (p - q <= 0.08) if a > 0 else (p - q >= -0.05)
        else:
            kl = q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))
            inside = (kl <= 0.08 or p <= q) if a > 0 else (kl <= 0.05 or p >= q)
        w = min(p / q, 1.3)
        n_cap += inside and p / q > 1.3
        assert loss[i, t].item() == pytest.approx(-a * w * lp if inside else 0.0, rel=1e-12, abs=1e-12)
        assert g[i, t].item() == pytest.approx(-a * w if inside else 0.0, rel=1e-12, abs=1e-12)
    assert m["pg_clipfrac_dual"].item() == pytest.approx(n_cap / mask.sum().item())


# ---------------------------------------------------------------- Clip-Cov / KL-Cov


def _cov_case():
    # A = [1, -1, 1, -1] (mean 0), logp = [-0.2, -1.5, -3.0, -1.0] (mean -1.425):
    # Cov = A (logp + 1.425) = [1.225, 0.075, -1.575, -0.425]; only token 0 lies in (1, 5)
    logp = _f64([-0.2, -1.5, -3.0, -1.0])
    return logp, _f64([1.0, -1.0, 1.0, -1.0]), torch.ones(1, 4)


def test_clip_cov_hand():
    logp, adv, mask = _cov_case()
    loss, g, m = _grad(POLICY_LOSSES.get("clip_cov"), logp, logp.clone(), adv, mask, cfg())  # r = 1
    # k = max(1, floor(0.25 * 4)) = 1 of the 1 candidate: token 0 gets loss 0 and no gradient
    torch.testing.assert_close(loss, _f64([0.0, 1.0, -1.0, 1.0]))
    torch.testing.assert_close(g, _f64([0.0, 1.0, -1.0, 1.0]))
    assert m["cov_clipfrac"].item() == 0.25


def test_clip_cov_vs_naive_loop():
    logp, old, adv, mask = _random_inputs(9, spread=0.4)
    c = cfg(clip_cov_lb=0.0, clip_cov_ub=0.5, clip_cov_ratio=0.2)
    torch.manual_seed(0)
    loss, g, m = _grad(POLICY_LOSSES.get("clip_cov"), logp, old, adv, mask, c)
    ppo, gp, _ = _grad(POLICY_LOSSES.get("clip"), logp, old, adv, mask, c)
    idx = [(i, t) for i, t in zip(*torch.nonzero(mask, as_tuple=True))]
    ma = sum(adv[i, t].item() for i, t in idx) / len(idx)
    ml = sum(logp[i, t].item() for i, t in idx) / len(idx)
    cand = [(i, t) for i, t in idx if 0.0 < (adv[i, t].item() - ma) * (logp[i, t].item() - ml) < 0.5
            and gp[i, t] != 0]  # in the band and not clipped by PPO (the clip zeroes the gradient)
    k = max(1, int(0.2 * len(idx)))
    held = [(i, t) for i, t in idx if loss[i, t] == 0 and ppo[i, t] != 0]
    assert len(held) == min(k, len(cand)) and all(h in cand for h in held)
    for i, t in idx:
        if (i, t) not in held:
            assert loss[i, t].item() == ppo[i, t].item() and g[i, t].item() == gp[i, t].item()
        else:
            assert g[i, t] == 0
    assert m["cov_clipfrac"].item() == pytest.approx(len(held) / len(idx))


def test_kl_cov_hand():
    logp, adv, mask = _cov_case()
    old = logp - _f64([0.1, 0.2, -0.3, 0.0])
    loss, g, m = _grad(POLICY_LOSSES.get("kl_cov"), logp, old, adv, mask, cfg())
    r = [math.exp(0.1), math.exp(0.2), math.exp(-0.3), 1.0]
    # token 0 has the largest Cov (1.225): -A r + 1.0 |log r| = -1.10517 + 0.1; the others -A r
    torch.testing.assert_close(loss, _f64([-r[0] + 0.1, r[1], -r[2], r[3]]))
    torch.testing.assert_close(g, _f64([-r[0] + 1.0, r[1], -r[2], r[3]]))
    assert m["cov_klfrac"].item() == 0.25


def test_kl_cov_vs_naive_loop():
    logp, old, adv, mask = _random_inputs(10, spread=0.4)
    c = cfg(kl_cov_ratio=0.3, kl_cov_coef=0.5)
    loss, g, _ = _grad(POLICY_LOSSES.get("kl_cov"), logp, old, adv, mask, c)
    idx = [(i, t) for i, t in zip(*torch.nonzero(mask, as_tuple=True))]
    ma = sum(adv[i, t].item() for i, t in idx) / len(idx)
    ml = sum(logp[i, t].item() for i, t in idx) / len(idx)
    cov = sorted(idx, key=lambda it: -(adv[it].item() - ma) * (logp[it].item() - ml))
    top = set(cov[:max(1, int(0.3 * len(idx)))])
    for i, t in idx:
        x, a = (logp[i, t] - old[i, t]).item(), adv[i, t].item()
        pen = 0.5 * abs(x) if (i, t) in top else 0.0
        assert loss[i, t].item() == pytest.approx(-a * math.exp(x) + pen, rel=1e-12, abs=1e-12)
        dpen = 0.5 * math.copysign(1.0, x) if (i, t) in top else 0.0
        assert g[i, t].item() == pytest.approx(-a * math.exp(x) + dpen, rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------- verl parity (formulas re-derived, float64)


def _verl_agg(mat, mask, mode):
    if mode == "token-mean":
        return (mat * mask).sum() / mask.sum()
    return ((mat * mask).sum(-1) / mask.sum(-1)).mean()  # seq-mean-token-mean, every row non-empty here


def _verl_cispo(lp, old, adv, mask, c):  # verl "cispo": -sg(clamp(r, 1 - low, 1 + high)) A logp
    r = torch.exp((lp - old).clamp(-20, 20))
    return _verl_agg(-r.clamp(1 - c.clip_low, 1 + c.clip_high).detach() * adv * lp, mask, "token-mean")


def _verl_sapo(lp, old, adv, mask, c):  # verl "sapo": gate sigmoid(tau (r - 1)) 4 / tau, tau by A > 0
    r = torch.exp((lp - old).clamp(-20, 20))
    tau = torch.where(adv > 0, torch.tensor(c.sapo_tau_pos, dtype=adv.dtype), torch.tensor(c.sapo_tau_neg, dtype=adv.dtype))
    return _verl_agg(-torch.sigmoid(tau * (r - 1)) * 4 / tau * adv, mask, "seq-mean-token-mean")


def _verl_geo_mean(lp, old, adv, mask, c):  # verl "geo_mean" (GMPO): mean over sequences, 1e-8 in the length
    x = lp - old
    sgn = torch.sign(adv)
    xm = sgn * torch.minimum(sgn * x, sgn * x.clamp(-c.clip_low, c.clip_high))
    n = mask.sum(-1)
    ratio = torch.exp((xm * mask).sum(-1) / (n + 1e-8))
    return torch.mean(-((adv * mask).sum(-1) / (n + 1e-8)) * ratio)


def _verl_dppo(kind):
    def fn(lp, old, adv, mask, c):  # verl "dppo_tv" / "dppo_kl": -A sg(min(r, C)) logp M
        r = torch.exp((lp - old).clamp(-20, 20))
        w = r.clamp(max=c.clip_c).detach()
        p, q = torch.exp(lp), torch.exp(old)
        if kind == "tv":
            m = torch.where(adv > 0, p - q <= c.clip_high, p - q >= -c.clip_low)
        else:
            kl = q * (old - lp) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
            m = torch.where(adv > 0, (kl <= c.clip_high) | (p <= q), (kl <= c.clip_low) | (p >= q))
        return _verl_agg(-adv * w * lp * m.detach().double(), mask, "token-mean")

    return fn


def _verl_kl_cov(lp, old, adv, mask, c):  # verl "kl_cov": -A r, + coef |log r| on the top Cov tokens
    x = lp - old
    loss = -adv * torch.exp(x)
    valid = mask > 0
    a, l_ = adv[valid].detach(), lp[valid].detach()
    cov = (a - a.mean()) * (l_ - l_.mean())
    top = torch.nonzero(valid.reshape(-1))[:, 0][torch.topk(cov, max(1, int(len(cov) * c.kl_cov_ratio))).indices]
    pen = torch.zeros(loss.numel(), dtype=torch.bool)
    pen[top] = True
    loss = torch.where(pen.view_as(loss), -adv * torch.exp(x) + c.kl_cov_coef * x.abs(), loss)
    return _verl_agg(loss, mask, "token-mean")


def _verl_clip_cov_all_in_band(lp, old, adv, mask, c):  # verl "clip_cov" when every candidate is held out
    r = torch.exp(lp - old)
    l1, l2 = -adv * r, -adv * r.clamp(1 - c.clip_low, 1 + c.clip_high)
    cov = (adv - adv[mask > 0].mean()) * (lp - lp.detach()[mask > 0].mean())
    held = (cov > c.clip_cov_lb) & (cov < c.clip_cov_ub) & ~(l2 > l1) & (mask > 0)
    return _verl_agg(torch.maximum(l1, l2) * (~held).double(), mask, "token-mean")


PARITY = [
    ("cispo", _verl_cispo, "token-mean", dict(clip_low=1.0, clip_high=0.28)),
    ("sapo", _verl_sapo, "seq-mean-token-mean", dict()),
    ("gmpo", _verl_geo_mean, "seq-mean-token-mean", dict(clip_low=0.4, clip_high=0.4)),
    ("dppo_tv", _verl_dppo("tv"), "token-mean", dict(clip_low=0.15, clip_high=0.15, clip_c=20.0)),
    ("dppo_kl", _verl_dppo("kl"), "token-mean", dict(clip_low=0.05, clip_high=0.05, clip_c=20.0)),
    ("kl_cov", _verl_kl_cov, "token-mean", dict(kl_cov_ratio=0.2)),
    ("clip_cov", _verl_clip_cov_all_in_band, "token-mean", dict(clip_cov_ratio=1.0, clip_cov_lb=0.05)),
]


@pytest.mark.parametrize("name, verl_fn, agg, kw", PARITY, ids=[p[0] for p in PARITY])
def test_verl_parity(name, verl_fn, agg, kw):
    """Aggregated loss and gradient equal verl's formula under verl's aggregation, every row non-empty.

    float64 throughout; the only difference in the arithmetic is GMPO's 1e-8 in verl's length
    (relative 1e-8 / n on a log-ratio sum of at most 20: below 1e-9 here) and DPPO-KL's 1e-8 inside verl's
    logs (it moves the binary KL by < 1e-7, and no token of these inputs lies that close to delta).
    """
    logp, old, adv, mask = _seq_adv_inputs(11)
    logp = logp - 1.0  # probabilities well inside (0, 1)
    old = old - 1.0
    mask[:, 0] = 1.0
    c = cfg(**kw)
    lp = logp.clone().requires_grad_(True)
    ours, _ = POLICY_LOSSES.get(name)(lp, old, adv, mask, c)
    ours = aggregate(ours, mask, agg)
    (g,) = torch.autograd.grad(ours, lp)
    lp2 = logp.clone().requires_grad_(True)
    theirs = verl_fn(lp2, old, adv, mask, c)
    (g2,) = torch.autograd.grad(theirs, lp2)
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=0, atol=1e-9)
    torch.testing.assert_close(g, g2, rtol=0, atol=1e-9)


# ---------------------------------------------------------------- token-sum


def test_token_sum_hand_naive_and_microbatches():
    nan = float("nan")
    loss = torch.tensor([[1.0, 2.0, 3.0, nan], [4.0, 9.0, 9.0, 9.0], [2.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    assert aggregate(loss, mask, "token-sum").item() == 6 + 4 + 8  # no normaliser
    naive = sum(loss[i, t].item() for i in range(3) for t in range(4) if mask[i, t])
    assert aggregate(loss, mask, "token-sum").item() == naive
    other = loss.clone()
    other[mask == 0] = 1e30
    assert aggregate(other, mask, "token-sum").item() == naive  # values under mask 0 change nothing
    # micro-batches: the trainer divides every micro-batch's numerator by the whole mini-batch's weight (1)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    m = (torch.rand(6, 5, generator=g) > 0.4).float()
    (full_grad,) = torch.autograd.grad(aggregate(x, m, "token-sum"), x)
    total = aggregation_weight(m, "token-sum")
    assert total.item() == 1.0
    for a, b in [(0, 2), (2, 5), (5, 6)]:
        (aggregate_parts(x[a:b], m[a:b], "token-sum")[0] / total).backward()
    torch.testing.assert_close(x.grad, full_grad)
    torch.testing.assert_close(full_grad, m.double())  # d/dx of a plain sum: 1 at valid, 0 elsewhere
    assert "token-sum" in AGGREGATIONS.names()


# ---------------------------------------------------------------- top-entropy masking


def test_top_entropy_mask_hand_and_naive():
    ent = torch.tensor([[0.1, 2.0, 0.5, 9.0], [1.0, 3.0, 0.2, 0.3]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    # 7 valid tokens, rho 0.2: k = ceil(1.4) = 2, the entropies 3.0 and 2.0 (9.0 is under mask 0)
    keep = top_entropy_mask(ent, mask, 0.2)
    assert keep.tolist() == [[False, True, False, False], [False, True, False, False]]
    assert top_entropy_mask(ent, mask, 1.0).tolist() == (mask != 0).tolist()
    g = torch.Generator().manual_seed(4)
    e, m = torch.rand(5, 7, generator=g), (torch.rand(5, 7, generator=g) > 0.3)
    for rho in (0.1, 0.35, 0.8):
        vals = sorted((e[i, t].item() for i in range(5) for t in range(7) if m[i, t]), reverse=True)
        tau = vals[math.ceil(rho * len(vals)) - 1]
        naive = [[bool(m[i, t]) and e[i, t].item() >= tau for t in range(7)] for i in range(5)]
        assert top_entropy_mask(e, m, rho).tolist() == naive
        junk = e.clone()
        junk[~m] = 1e9
        assert top_entropy_mask(junk, m, rho).tolist() == naive  # entropies under mask 0 change nothing


# ---------------------------------------------------------------- MaxRL advantage


def test_maxrl_hand():
    from rlft.core.advantages import maxrl

    # MaxRL (Tajwar et al. 2026, Theorem 2 with the group-mean control variate): A = (r - rbar) / rbar.
    # group 1: rbar 1/4 -> 1 is (1 - 1/4) / (1/4) = 3, 0 is -1; group 2: rbar 1/2 -> +1 / -1; group 3: all 0 -> 0
    scores = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0])
    assert maxrl(scores, 4).tolist() == [3.0, -1, -1, -1, 1, 1, -1, -1, 0, 0, 0, 0]
    # the 1/K weighting: the sum over the group of A_i grad log pi_i is (N / K) sum over successes minus the sum over all
    assert maxrl(torch.tensor([1.0, 1, 1, 1]), 4).tolist() == [0.0] * 4


def test_maxrl_vs_naive_loop_nan_and_range():
    from rlft.core.advantages import ADVANTAGES, AdvantageInputs, maxrl

    g = torch.Generator().manual_seed(5)
    scores = (torch.rand(24, generator=g) > 0.6).double()
    scores[3] = float("nan")  # unscorable: out of its group's mean, advantage 0
    adv = maxrl(scores, 6)
    for p in range(4):
        grp = [scores[p * 6 + j].item() for j in range(6)]
        ok = [x for x in grp if not math.isnan(x)]
        mean = sum(ok) / len(ok)
        for j, x in enumerate(grp):
            want = 0.0 if math.isnan(x) or mean == 0 or len(set(ok)) == 1 else (x - mean) / mean
            assert adv[p * 6 + j].item() == pytest.approx(want, rel=1e-12, abs=0)
    mask = torch.ones(24, 3)
    mask[0, 2] = 0
    a, ret = ADVANTAGES.get("maxrl")(AdvantageInputs(scores=scores, mask=mask, group_size=6), SimpleNamespace(adv_eps=1e-6))
    assert a[0, 2] == 0 and (a[:, 0] == adv).all() and torch.equal(a, ret)
    with pytest.raises(ValueError, match="maxrl.*\\[0, 1\\]"):
        maxrl(torch.tensor([1.0, 2.0, 0.0, 0.0]), 4)


# ---------------------------------------------------------------- config


@pytest.mark.parametrize("kwargs, match", [
    (dict(sapo_tau_pos=0.0), "algo.sapo_tau_pos"),
    (dict(sapo_tau_neg=-1.0), "algo.sapo_tau_neg"),
    (dict(clip_cov_ratio=0.0), "algo.clip_cov_ratio"),
    (dict(clip_cov_lb=5.0, clip_cov_ub=1.0), "algo.clip_cov_lb/clip_cov_ub"),
    (dict(kl_cov_ratio=1.5), "algo.kl_cov_ratio"),
    (dict(kl_cov_coef=-1.0), "algo.kl_cov_coef"),
    (dict(entropy_top_frac=0.0), "algo.entropy_top_frac"),
    (dict(policy_loss="gmpo", loss_agg="token-mean"), "algo.loss_agg"),
    (dict(policy_loss="gmpo", loss_agg="seq-mean-token-mean", advantage="gae"), "algo.policy_loss"),
    (dict(policy_loss="cispo", clip_c=3.0), "algo.clip_c"),
    (dict(policy_loss="sapo", clip_c=3.0), "algo.clip_c"),
])
def test_config_validation_names_the_key(kwargs, match):
    from rlft.config import AlgoConfig, ConfigError

    with pytest.raises(ConfigError, match=match):
        AlgoConfig(**kwargs)


def test_config_accepts_each_new_choice():
    from rlft.config import AlgoConfig

    for loss in ("cispo", "sapo", "dppo_tv", "dppo_kl", "clip_cov", "kl_cov"):
        AlgoConfig(policy_loss=loss)
    AlgoConfig(policy_loss="gmpo", loss_agg="seq-mean-token-mean")
    AlgoConfig(policy_loss="dppo_tv", clip_c=20.0)  # the IS-weight cap
    AlgoConfig(advantage="maxrl", loss_agg="token-sum", entropy_top_frac=0.2)


# ---------------------------------------------------------------- GDPO advantage


def test_gdpo_hand_and_the_collapse_it_avoids():
    from rlft.core.advantages import gdpo_advantages, group_norm

    # two binary rewards, G = 2.  Group 1: (1, 0) and (0, 1); group 2: (1, 1) and (0, 0).
    parts = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    # per component group_norm (unbiased std 0.7071): group 1 -> (+0.7071 - 0.7071, -0.7071 + 0.7071) = (0, 0);
    # group 2 -> (+1.4142, -1.4142); batch-normalised: std = sqrt(2 * 2 / 3) = 1.1547 -> +-1.2247
    adv = gdpo_advantages(parts, (1.0, 1.0), torch.ones(4, dtype=torch.bool), 2, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, math.sqrt(1.5), -math.sqrt(1.5)], dtype=torch.float64))
    # GRPO on the summed reward: group 2's sums (2, 0) and a (1, 2)-vs-(0, 1) group give the same +-0.7071
    assert group_norm(torch.tensor([2.0, 0.0]), 2).tolist() == pytest.approx(
        group_norm(torch.tensor([2.0, 1.0]), 2).tolist(), abs=1e-5)


def test_gdpo_vs_naive_loop_weights_and_nan():
    from rlft.core.advantages import ADVANTAGES, AdvantageInputs

    g = torch.Generator().manual_seed(6)
    B, G, K = 12, 4, 3
    parts = torch.rand(B, K, generator=g, dtype=torch.float64).round(decimals=1)
    parts[5, 1] = float("nan")  # one component unscorable: out of its group's statistics
    scores = parts.nan_to_num(0.0).sum(-1)
    scores[9] = float("nan")  # an unscorable sequence: advantage 0, out of the batch statistics
    weights = (1.0, 0.5, 2.0)
    mask = torch.ones(B, 2)
    mask[3, 1] = 0
    inp = AdvantageInputs(scores, mask, G, reward_parts=parts, reward_weights=weights)
    adv, ret = ADVANTAGES.get("gdpo")(inp, SimpleNamespace(adv_eps=1e-6))
    total = [0.0] * B
    for k in range(K):
        for p in range(B // G):
            rows = [p * G + j for j in range(G) if not math.isnan(parts[p * G + j, k].item())]
            vals = [parts[i, k].item() for i in rows]
            if len(vals) < 2 or len(set(vals)) == 1:
                continue
            mean = sum(vals) / len(vals)
            std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
            for i in rows:
                total[i] += weights[k] * (parts[i, k].item() - mean) / (std + 1e-6)
    ok = [i for i in range(B) if not math.isnan(scores[i].item())]
    mean = sum(total[i] for i in ok) / len(ok)
    std = math.sqrt(sum((total[i] - mean) ** 2 for i in ok) / (len(ok) - 1))
    for i in range(B):
        want = (total[i] - mean) / (std + 1e-6) if i in ok else 0.0
        assert adv[i, 0].item() == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert adv[3, 1] == 0 and torch.equal(adv, ret)
    with pytest.raises(ValueError, match="reward_parts"):
        ADVANTAGES.get("gdpo")(AdvantageInputs(scores, mask, G), SimpleNamespace(adv_eps=1e-6))
    with pytest.raises(ValueError, match="3 reward components but 2 weights"):
        ADVANTAGES.get("gdpo")(AdvantageInputs(scores, mask, G, reward_parts=parts, reward_weights=(1.0, 1.0)),
                               SimpleNamespace(adv_eps=1e-6))


def _verl_gdpo(parts, mask, group_size, eps=1e-6):
    """verl-GDPO's advantage (NVlabs/GDPO, verl-GDPO's ray_trainer ``adv_estimator == 'gdpo'``), re-derived in
    float64: each component through verl's GRPO outcome advantage (group mean, unbiased std, ``/ (std + eps)``,
    broadcast over the response tokens), the components summed unweighted, then verl's ``masked_whiten`` over
    the batch's response *tokens* (token-weighted mean, variance with Bessel's correction over the token count,
    ``* rsqrt(var + 1e-8)``).  Returns (advantage (B, T), the summed components before the whitening (B,))."""
    B, K = parts.shape
    total = [0.0] * B
    for k in range(K):
        for p0 in range(0, B, group_size):
            vals = [parts[i, k].item() for i in range(p0, p0 + group_size)]
            mean = sum(vals) / group_size
            std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (group_size - 1))
            for j, v in enumerate(vals):
                total[p0 + j] += (v - mean) / (std + eps)
    tok = [(i, t) for i in range(B) for t in range(mask.shape[1]) if mask[i, t]]
    n = len(tok)
    mean = sum(total[i] for i, _ in tok) / n
    var = sum((total[i] - mean) ** 2 for i, _ in tok) / n * n / (n - 1)
    adv = torch.zeros(mask.shape, dtype=torch.float64)
    for i, t in tok:
        adv[i, t] = (total[i] - mean) / math.sqrt(var + 1e-8)
    return adv, total


def test_gdpo_parity_with_verl_gdpo_same_centred_sum_sequence_not_token_statistics():
    """verl parity: with unit weights rlft's GDPO and verl-GDPO's sum the same group-normalised components and
    centre them at the same mean when every response has the same length; they differ only in the batch
    scale: rlft divides by the unbiased std over *sequences* plus eps (the paper's batch-wise normalisation over
    samples), verl-GDPO by sqrt(unbiased variance over *tokens* + 1e-8).  With unequal lengths verl-GDPO's token
    weighting also moves the batch mean towards the longer responses; rlft's does not."""
    from rlft.core.advantages import ADVANTAGES, AdvantageInputs

    g = torch.Generator().manual_seed(11)
    B, G, K, T = 16, 4, 2, 5
    parts = torch.randint(0, 2, (B, K), generator=g).double()
    parts[0:4, 0] = torch.tensor([1.0, 0.0, 0.0, 1.0])  # no degenerate-group luck: group 0 varies in both parts
    parts[0:4, 1] = torch.tensor([0.0, 1.0, 1.0, 1.0])
    # an all-equal group has std 0 in both: verl's (v - mean) / eps is 0, rlft's degenerate group gives 0
    mask = torch.ones(B, T)
    cfg = SimpleNamespace(adv_eps=1e-6)
    ours = ADVANTAGES.get("gdpo")(AdvantageInputs(parts.sum(-1), mask, G, reward_parts=parts,
                                                  reward_weights=(1.0,) * K), cfg)[0]
    theirs, total = _verl_gdpo(parts, mask, G)
    mean = sum(total) / B
    seq_std = math.sqrt(sum((x - mean) ** 2 for x in total) / (B - 1))
    n = B * T
    tok_scale = math.sqrt(seq_std ** 2 * (B - 1) / B * n / (n - 1) + 1e-8)
    for i in range(B):
        centred = total[i] - mean
        assert ours[i, 0].item() * (seq_std + 1e-6) == pytest.approx(centred, abs=1e-12)
        assert theirs[i, 0].item() * tok_scale == pytest.approx(centred, abs=1e-12)
    # the two differ by one batch-wide factor, here (B = 16, T = 5) within 3.2% of 1
    ratio = (seq_std + 1e-6) / tok_scale
    nz = ours[:, 0].abs() > 1e-9
    torch.testing.assert_close(theirs[nz, 0], ours[nz, 0] * ratio, rtol=1e-12, atol=0.0)
    assert 1.0 < ratio < 1.032
    # unequal lengths: verl-GDPO's token-weighted mean is not rlft's sequence mean
    mask[B // 2:, 2:] = 0
    theirs_ragged, _ = _verl_gdpo(parts, mask, G)
    ours_ragged = ADVANTAGES.get("gdpo")(AdvantageInputs(parts.sum(-1), mask, G, reward_parts=parts,
                                                         reward_weights=(1.0,) * K), cfg)[0]
    assert torch.equal(ours_ragged[:, 0], ours[:, 0])  # rlft's sequence statistics ignore the lengths
    assert (theirs_ragged[:, 0] - theirs[:, 0]).abs().max() > 1e-3


def test_gdpo_values_under_mask_change_nothing():
    from rlft.core.advantages import ADVANTAGES, AdvantageInputs

    parts = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]])
    base = ADVANTAGES.get("gdpo")(AdvantageInputs(parts.sum(-1), mask, 2, reward_parts=parts,
                                                  reward_weights=(1.0, 1.0)), SimpleNamespace(adv_eps=1e-6))[0]
    tr = torch.where(mask == 0, torch.tensor(float("nan")), torch.zeros(4, 3))  # junk token rewards are not read
    other = ADVANTAGES.get("gdpo")(AdvantageInputs(parts.sum(-1), mask, 2, token_rewards=tr, reward_parts=parts,
                                                   reward_weights=(1.0, 1.0)), SimpleNamespace(adv_eps=1e-6))[0]
    assert torch.equal(base, other) and (base[mask == 0] == 0).all()


def test_gdpo_with_fewer_than_two_scorable_sequences_is_zero_and_bad_parts_are_named():
    from rlft.core.advantages import AdvantageInputs, gdpo_advantages

    parts = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    one = torch.tensor([True, False, False, False])
    assert torch.equal(gdpo_advantages(parts, (1.0, 1.0), one, 2), torch.zeros(4))  # no spread to normalise by
    with pytest.raises(ValueError, match=r"reward_parts must be \(B, K\) with B=2"):
        AdvantageInputs(torch.zeros(2), torch.ones(2, 3), 2, reward_parts=torch.zeros(3, 2))
