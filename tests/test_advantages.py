import dataclasses
import math
import statistics
from types import SimpleNamespace

import pytest
import torch

from rlft.core.advantages import (
    ADVANTAGES,
    AdvantageInputs,
    discounted_returns,
    ema_update,
    gae_advantages,
    group_mean,
    group_norm,
    group_stats,
    length_adaptive_lambda,
    mean_return,
    outcome_rewards,
    rloo,
)
from numerics import unit_roundoff

NAN = float("nan")
INF = float("inf")
PURE = {"group_norm": group_norm, "group_mean": group_mean, "rloo": rloo}
TOKEN_LEVEL = ["gae", "reinforce", "reinforce_pp"]
RPPB = "reinforce_pp_baseline"


def cfg(**kw):
    base = dict(adv_eps=1e-6, gamma=1.0, lam=0.95, lam_critic=1.0, length_alpha=0.0, baseline="batch_mean",
                whiten_adv=False)
    return SimpleNamespace(**{**base, **kw})


def ragged(B=5, T=7, seed=0, holes=False):
    """Random float64 inputs, right-padded ragged mask (no empty row), large junk under the mask."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (B, T)
    if holes:
        mask[0, 2] = 0  # a masked-out token inside a sequence (e.g. a tool observation)
    scores = torch.randn(B, generator=g, dtype=torch.float64)
    tr = 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    tr[mask == 0] = 1e6
    values[mask == 0] = -1e6
    return scores, mask, tr, values


# ---------------------------------------------------------------- naive references (python loops over samples and tokens)


def _valid_seq(scores, mask, tr, values, b):
    """Rewards and values of row b's valid tokens, score added at the last one."""
    idx = [t for t in range(mask.shape[1]) if mask[b, t]]
    r = [float(tr[b, t]) for t in idx]
    r[-1] += float(scores[b])
    return idx, r, [float(values[b, t]) for t in idx]


def naive_gae(scores, mask, tr, values, gamma, lam):
    """A_t = sum_l (gamma lam)^l delta_{t+l}, as a double loop over (t, l); lam may be a per-row list."""
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for b in range(mask.shape[0]):
        lb = lam[b] if isinstance(lam, list) else lam
        idx, r, v = _valid_seq(scores, mask, tr, values, b)
        L = len(idx)
        delta = [r[k] + gamma * (v[k + 1] if k + 1 < L else 0.0) - v[k] for k in range(L)]
        for t in range(L):
            out[b, idx[t]] = sum((gamma * lb) ** l * delta[t + l] for l in range(L - t))
    return out


def naive_returns(scores, mask, tr, gamma):
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for b in range(mask.shape[0]):
        idx, r, _ = _valid_seq(scores, mask, tr, torch.zeros(mask.shape), b)
        for t in range(len(idx)):
            out[b, idx[t]] = sum(gamma**l * r[t + l] for l in range(len(idx) - t))
    return out


def _naive(scores, G, kind, eps=1e-6):
    out = []
    for p in range(len(scores) // G):
        group = scores[p * G : (p + 1) * G]
        valid = [r for r in group if not math.isnan(r)]
        for r in group:
            if math.isnan(r) or len(valid) < 2 or len(set(valid)) == 1:
                out.append(0.0)
                continue
            mean = sum(valid) / len(valid)
            if kind == "group_norm":
                out.append((r - mean) / (statistics.stdev(valid) + eps))
            elif kind == "group_mean":
                out.append(r - mean)
            else:
                out.append(r - (sum(valid) - r) / (len(valid) - 1))
    return out


# ---------------------------------------------------------------- group estimators, pure (B,) -> (B,)


def test_registry_names_and_contract():
    assert set(ADVANTAGES.names()) == {"group_norm", "group_mean", "rloo", "gae", "reinforce", "reinforce_pp",
                                       "reinforce_pp_baseline", "process", "maxrl", "gdpo"}
    scores, mask, tr, values = ragged(B=4, T=5, seed=3)
    steps = (torch.arange(5) % 2 == 1).long().expand(4, 5)  # (B, T) a step ends at every other token (process)
    inp = AdvantageInputs(scores, mask, 2, token_rewards=tr, values=values, baseline=0.1, step_rewards=values,
                          step_mask=steps, reward_parts=torch.stack([scores, -scores], 1), reward_weights=(1.0, 0.5))
    for name in ADVANTAGES.names():
        # maxrl is defined for pass/fail rewards: its inputs here are the same scores thresholded at their median
        x = dataclasses.replace(inp, scores=(scores > scores.nanmedian()).to(scores.dtype), token_rewards=None) \
            if name == "maxrl" else inp
        adv, ret = ADVANTAGES.get(name)(x, cfg())
        assert adv.shape == ret.shape == mask.shape, name
        assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all(), name
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all(), name


def test_group_norm_unbiased_std_convention():
    adv = group_norm(torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64), group_size=4)  # float64: rounding ~1e-16
    s = 0.5 / math.sqrt(1.0 / 3.0)  # std with Bessel's correction is sqrt(1/3)
    assert s == pytest.approx(0.866, abs=1e-3)
    s = 0.5 / (math.sqrt(1.0 / 3.0) + 1e-6)  # adv_eps = 1e-6 is added to the std
    torch.testing.assert_close(adv, torch.tensor([s, -s, -s, s], dtype=torch.float64))


def test_tutorial_rewards_group_mean():
    scores = torch.tensor([1.0, -0.5, 1.0, -1.0])
    mean, std, zero_std = group_stats(scores, 4)
    assert mean.item() == pytest.approx(0.125)
    assert std.item() == pytest.approx(statistics.stdev([1.0, -0.5, 1.0, -1.0]))
    assert not zero_std.item()
    torch.testing.assert_close(group_mean(scores, 4), torch.tensor([0.875, -0.625, 0.875, -1.125]))


def test_rloo_hand():
    torch.testing.assert_close(rloo(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))


def test_zero_std_and_small_groups_give_zero():
    scores = torch.tensor([0.3, 0.3, 0.3, 1.0, NAN, NAN, NAN, NAN, 2.0, NAN])
    for fn in (group_norm, group_mean, rloo):
        adv = fn(scores, 2)
        assert adv[:2].tolist() == [0.0, 0.0]  # equal rewards
        assert adv[4:].tolist() == [0.0] * 6  # < 2 valid samples
        assert adv[2].item() != 0.0
    _, std, zero_std = group_stats(scores, 2)
    assert zero_std.tolist() == [True, False, True, True, True]
    assert std[0].item() == 0.0 and std[2:].tolist() == [0.0, 0.0, 0.0]


def test_nan_excluded_from_statistics():
    scores = torch.tensor([1.0, NAN, 0.0, 0.0, 1.0])
    # the valid group is [1, 0, 0, 1]
    s = 0.5 / (math.sqrt(1.0 / 3.0) + 1e-6)  # unbiased std + adv_eps; float64 below: rounding ~1e-16
    torch.testing.assert_close(group_norm(scores.double(), 5), torch.tensor([s, 0.0, -s, -s, s], dtype=torch.float64))
    torch.testing.assert_close(rloo(scores, 5), torch.tensor([2 / 3, 0.0, -2 / 3, -2 / 3, 2 / 3]))
    torch.testing.assert_close(group_mean(scores, 5), torch.tensor([0.5, 0.0, -0.5, -0.5, 0.5]))
    mean, _, _ = group_stats(scores, 5)
    assert mean.item() == pytest.approx(0.5)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="divisible"):
        group_norm(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="divisible"):
        group_stats(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="1-D"):
        group_norm(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="group_size"):
        rloo(torch.zeros(4), 0)


def test_integer_scores_accepted():
    torch.testing.assert_close(rloo(torch.tensor([1, 0, 0, 1]), 4), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))


@pytest.mark.parametrize("kind", ["group_norm", "group_mean", "rloo"])
def test_vs_naive_loop(kind):
    g = torch.Generator().manual_seed(0)
    P, G = 7, 5
    scores = torch.randn(P * G, generator=g, dtype=torch.float64)
    scores[torch.rand(P * G, generator=g) < 0.3] = NAN
    scores[:G] = 1.0  # a zero-std group
    got = PURE[kind](scores, G).tolist()
    want = _naive(scores.tolist(), G, kind)
    assert got == pytest.approx(want, abs=1e-9)


def test_group_stats_vs_naive():
    g = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 3, (24,), generator=g).double()
    scores[torch.rand(24, generator=g) < 0.25] = NAN
    mean, std, zero_std = group_stats(scores, 4)
    for p in range(6):
        valid = [r for r in scores[p * 4 : (p + 1) * 4].tolist() if not math.isnan(r)]
        assert mean[p].item() == pytest.approx(sum(valid) / len(valid) if valid else 0.0)
        assert std[p].item() == pytest.approx(statistics.stdev(valid) if len(valid) >= 2 else 0.0)
        assert zero_std[p].item() == (len(set(valid)) <= 1)


@pytest.mark.parametrize("kind", ["group_norm", "group_mean", "rloo"])
def test_other_groups_and_permutation_invariance(kind):
    fn = PURE[kind]
    scores = torch.tensor([1.0, 0.0, 0.5, NAN, 0.2, 0.9, 0.9, 0.1])
    base = fn(scores, 4)
    changed = scores.clone()
    changed[4:] = torch.tensor([5.0, -3.0, NAN, 2.0])  # another group: no effect on group 0
    torch.testing.assert_close(fn(changed, 4)[:4], base[:4])
    perm = torch.tensor([2, 0, 3, 1])  # permuting within a group permutes the advantages
    torch.testing.assert_close(fn(scores[:4][perm], 4), base[:4][perm])


# ---------------------------------------------------------------- group estimators through the registry, (B, T)


@pytest.mark.parametrize("kind", ["group_norm", "group_mean", "rloo"])
def test_registry_group_equals_pure_broadcast(kind):
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, NAN, 0.2, 0.9])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]] * 2, dtype=torch.bool)
    adv, ret = ADVANTAGES.get(kind)(AdvantageInputs(scores, mask, 4), cfg(adv_eps=0.1))
    want = PURE[kind](scores, 4, 0.1)[:, None] * mask  # (B, T)
    torch.testing.assert_close(adv, want)
    torch.testing.assert_close(ret, adv)  # verl: ret = adv for outcome estimators
    assert adv[0].tolist() == pytest.approx([want[0, 0].item()] * 3) and adv[0, 0] != 0


@pytest.mark.parametrize("kind", ["group_norm", "group_mean", "rloo"])
def test_kl_token_rewards_shift_the_outcome(kind):
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]])
    tr = torch.tensor([[-0.25, -0.25, NAN], [0.0, 0.0, 0.0], [0.0, INF, -INF], [-0.5, 0.0, -0.5]], dtype=torch.float64)
    inp = AdvantageInputs(scores, mask, 4, token_rewards=tr)
    torch.testing.assert_close(outcome_rewards(inp), torch.tensor([0.5, 0.0, 0.0, 0.0], dtype=torch.float64))
    adv, _ = ADVANTAGES.get(kind)(inp, cfg())
    want = PURE[kind](torch.tensor([0.5, 0.0, 0.0, 0.0], dtype=torch.float64), 4)[:, None] * mask
    torch.testing.assert_close(adv, want)
    plain, _ = ADVANTAGES.get(kind)(AdvantageInputs(scores, mask, 4), cfg())
    assert not torch.allclose(adv, plain)


def test_group_registry_unscorable_gets_zero():
    scores = torch.tensor([1.0, NAN, 0.0, 0.0, 1.0], dtype=torch.float64)
    mask = torch.ones(5, 2)
    s = 0.5 / (math.sqrt(1.0 / 3.0) + 1e-6)  # unbiased std + adv_eps; float64: rounding ~1e-16
    adv, _ = ADVANTAGES.get("group_norm")(AdvantageInputs(scores, mask, 5), cfg())
    torch.testing.assert_close(adv[:, 0], torch.tensor([s, 0.0, -s, -s, s], dtype=torch.float64))
    assert adv[1].tolist() == [0.0, 0.0]


# ---------------------------------------------------------------- GAE


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (1.0, 0.95), (0.9, 0.5), (0.99, 0.0), (0.5, 0.8)])
@pytest.mark.parametrize("holes", [False, True])
def test_gae_vs_naive_double_loop(gamma, lam, holes):
    scores, mask, tr, values = ragged(seed=int(10 * gamma + 100 * lam), holes=holes)
    want = naive_gae(scores, mask, tr, values, gamma, lam)
    r = torch.zeros_like(tr)
    for b in range(mask.shape[0]):
        idx, rb, _ = _valid_seq(scores, mask, tr, values, b)
        r[b, idx] = torch.tensor(rb, dtype=torch.float64)
    torch.testing.assert_close(gae_advantages(r, values, mask, gamma, lam), want)  # pure function
    inp = AdvantageInputs(scores, mask, 1, token_rewards=tr, values=values)
    adv, ret = ADVANTAGES.get("gae")(inp, cfg(gamma=gamma, lam=lam, lam_critic=lam))
    torch.testing.assert_close(adv, want)  # through the registry: score at the last valid token
    torch.testing.assert_close(ret, (want + values) * mask)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_gae_lambda_one_is_monte_carlo_minus_values(gamma):
    scores, mask, tr, values = ragged(seed=5)
    inp = AdvantageInputs(scores, mask, 1, token_rewards=tr, values=values)
    adv, ret = ADVANTAGES.get("gae")(inp, cfg(gamma=gamma, lam=1.0))
    mc = naive_returns(scores, mask, tr, gamma)
    torch.testing.assert_close(adv, (mc - values) * mask)
    torch.testing.assert_close(ret, mc)  # lam_critic = 1: Monte-Carlo return targets


@pytest.mark.parametrize("gamma", [1.0, 0.7])
def test_gae_lambda_zero_is_one_step_td(gamma):
    scores, mask, tr, values = ragged(seed=6)
    adv, _ = ADVANTAGES.get("gae")(AdvantageInputs(scores, mask, 1, token_rewards=tr, values=values),
                                   cfg(gamma=gamma, lam=0.0))
    for b in range(mask.shape[0]):
        idx, r, v = _valid_seq(scores, mask, tr, values, b)
        for k, t in enumerate(idx):
            v_next = v[k + 1] if k + 1 < len(idx) else 0.0
            assert adv[b, t].item() == pytest.approx(r[k] + gamma * v_next - v[k], abs=1e-12)


def test_gae_decoupled_lambdas():
    scores, mask, tr, values = ragged(seed=7)
    inp = AdvantageInputs(scores, mask, 1, token_rewards=tr, values=values)
    adv, ret = ADVANTAGES.get("gae")(inp, cfg(gamma=0.99, lam=0.6, lam_critic=1.0))
    torch.testing.assert_close(adv, naive_gae(scores, mask, tr, values, 0.99, 0.6))
    torch.testing.assert_close(ret, naive_returns(scores, mask, tr, 0.99))  # lam_critic=1 -> ret = A(1) + V = MC
    assert not torch.allclose(adv, (ret - values) * mask)  # actor and critic use different lambdas


def test_length_adaptive_lambda_values():
    lam = length_adaptive_lambda(torch.tensor([100, 10, 20, 0, 10**6]), 0.05)
    assert lam[0].item() == pytest.approx(0.8)  # 1 - 1 / (0.05 * 100)
    assert lam[1].item() == 0.0 and lam[2].item() == 0.0 and lam[3].item() == 0.0  # clamped at 0
    assert lam[4].item() == pytest.approx(1 - 1 / 5e4)
    for alpha in (0.0, -1.0):
        with pytest.raises(ValueError, match="length_alpha"):
            length_adaptive_lambda(torch.tensor([5]), alpha)


def test_gae_length_adaptive_equals_per_sequence_gae():
    scores, mask, tr, values = ragged(B=4, T=9, seed=8)
    alpha = 0.3
    lengths = mask.sum(-1)
    inp = AdvantageInputs(scores, mask, 1, token_rewards=tr, values=values)
    adv, ret = ADVANTAGES.get("gae")(inp, cfg(gamma=0.95, lam=0.1, lam_critic=1.0, length_alpha=alpha))
    lams = length_adaptive_lambda(lengths, alpha).tolist()  # the float32 lambdas the estimator uses, exactly
    # VAPO eq. 7, up to four float32 roundings (alpha, alpha * n, 1 / ., 1 - .) of values in [0, 1], each <= u
    assert lams == pytest.approx([min(max(1 - 1 / (alpha * n), 0.0), 1.0) for n in lengths.tolist()],
                                 rel=0, abs=5 * unit_roundoff(torch.float32))
    assert len(set(lams)) > 1
    for b in range(4):  # one sequence at a time with its own float lambda
        row = AdvantageInputs(scores[b : b + 1], mask[b : b + 1], 1, token_rewards=tr[b : b + 1], values=values[b : b + 1])
        adv_b, ret_b = ADVANTAGES.get("gae")(row, cfg(gamma=0.95, lam=lams[b], lam_critic=1.0))
        torch.testing.assert_close(adv[b : b + 1], adv_b)
        torch.testing.assert_close(ret[b : b + 1], ret_b)  # the critic keeps lam_critic
    torch.testing.assert_close(adv, naive_gae(scores, mask, tr, values, 0.95, lams))


def test_gae_whitening_over_valid_tokens():
    scores, mask, tr, values = ragged(seed=9)
    scores[3] = NAN
    inp = AdvantageInputs(scores, mask, 1, token_rewards=tr, values=values)
    raw, ret_raw = ADVANTAGES.get("gae")(inp, cfg(whiten_adv=False))
    adv, ret = ADVANTAGES.get("gae")(inp, cfg(whiten_adv=True))
    keep = (mask != 0)
    keep[3] = False
    xs = raw[keep].tolist()
    want = [(x - statistics.mean(xs)) / math.sqrt(statistics.variance(xs) + 1e-8) for x in xs]
    assert adv[keep].tolist() == pytest.approx(want, abs=1e-9)
    assert statistics.mean(adv[keep].tolist()) == pytest.approx(0.0, abs=1e-9)
    v = statistics.variance(xs)  # the whitened variance is v / (v + 1e-8), exactly; float64 rounding ~1e-15
    assert statistics.variance(adv[keep].tolist()) == pytest.approx(v / (v + 1e-8), rel=1e-12)
    assert (adv[3] == 0).all() and (adv[mask == 0] == 0).all()
    torch.testing.assert_close(ret, ret_raw)  # whitening touches the actor only


def test_gae_requires_values():
    scores, mask, tr, _ = ragged(seed=10)
    with pytest.raises(ValueError, match="`values`"):
        ADVANTAGES.get("gae")(AdvantageInputs(scores, mask, 1, token_rewards=tr), cfg())


def test_gae_without_token_rewards_puts_score_at_the_end():
    scores = torch.tensor([2.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    values = torch.tensor([[0.5, 0.25, 1.0], [0.0, 0.5, NAN]], dtype=torch.float64)
    adv, ret = ADVANTAGES.get("gae")(AdvantageInputs(scores, mask, 1, values=values), cfg(gamma=1.0, lam=1.0))
    # lam = 1, gamma = 1: A_t = score - V_t
    torch.testing.assert_close(adv, torch.tensor([[1.5, 1.75, 1.0], [-1.0, -1.5, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(ret, torch.tensor([[2.0, 2.0, 2.0], [-1.0, -1.0, 0.0]], dtype=torch.float64))


# ---------------------------------------------------------------- REINFORCE, REINFORCE++


def hand_batch():
    """3 sequences, gamma = 0.5; the third is unscorable.  Hand-computed returns:
    row 0: r = [-0.1, 0, -0.2 + 1] -> G = [-0.1 + 0.5 * 0.4, 0 + 0.5 * 0.8, 0.8] = [0.1, 0.4, 0.8]
    row 1: r = [0.5, 0 + 0]        -> G = [0.5, 0.0]
    """
    scores = torch.tensor([1.0, 0.0, NAN], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    tr = torch.tensor([[-0.1, 0.0, -0.2], [0.5, 0.0, NAN], [9.0, 9.0, 9.0]], dtype=torch.float64)
    values = torch.tensor([[0.3, 0.2, 0.1], [0.4, 0.6, INF], [0.7, 0.8, 0.9]], dtype=torch.float64)
    G = torch.tensor([[0.1, 0.4, 0.8], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    return AdvantageInputs(scores, mask, 1, token_rewards=tr, values=values), G


def test_discounted_returns_hand_and_naive():
    inp, G = hand_batch()
    r = torch.tensor([[-0.1, 0.0, 0.8], [0.5, 0.0, 7.0]], dtype=torch.float64)
    torch.testing.assert_close(discounted_returns(r, inp.mask[:2], 0.5), G[:2])
    scores, mask, tr, _ = ragged(seed=11)
    _, ret = ADVANTAGES.get("reinforce")(AdvantageInputs(scores, mask, 1, token_rewards=tr), cfg(gamma=0.8))
    torch.testing.assert_close(ret, naive_returns(scores, mask, tr, 0.8))


@pytest.mark.parametrize("baseline,b", [("none", 0.0), ("batch_mean", 0.3), ("ema", 0.2)])
def test_reinforce_baselines_hand(baseline, b):
    inp, G = hand_batch()
    inp = AdvantageInputs(inp.scores, inp.mask, 1, token_rewards=inp.token_rewards, baseline=0.2)
    adv, ret = ADVANTAGES.get("reinforce")(inp, cfg(gamma=0.5, baseline=baseline))
    torch.testing.assert_close(ret, G)
    valid = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(adv, torch.where(valid, G - b, 0.0))  # batch_mean = mean(0.1, 0.5), NaN row excluded
    assert mean_return(inp, 0.5) == pytest.approx(0.3)


def test_reinforce_baseline_errors():
    inp, _ = hand_batch()
    with pytest.raises(ValueError, match="baseline"):
        ADVANTAGES.get("reinforce")(inp, cfg(baseline="ema"))  # no running baseline given
    with pytest.raises(ValueError, match="unknown 'median'"):
        ADVANTAGES.get("reinforce")(inp, cfg(baseline="median"))


def test_ema_update():
    assert ema_update(None, 0.3, 0.9) == 0.3  # first call returns the value
    assert ema_update(0.3, 1.3, 0.9) == pytest.approx(0.9 * 0.3 + 0.1 * 1.3)
    assert ema_update(0.5, 1.0, 0.0) == 1.0


def test_reinforce_pp_whitened_returns():
    inp, G = hand_batch()
    adv, ret = ADVANTAGES.get("reinforce_pp")(inp, cfg(gamma=0.5))
    torch.testing.assert_close(ret, G)  # unwhitened returns
    xs = [0.1, 0.4, 0.8, 0.5, 0.0]  # valid tokens of the scorable rows (global, not per group)
    mu, sd = statistics.mean(xs), math.sqrt(statistics.variance(xs) + 1e-8)
    want = torch.tensor([[(x - mu) / sd for x in xs[:3]], [(xs[3] - mu) / sd, (xs[4] - mu) / sd, 0.0], [0.0] * 3],
                        dtype=torch.float64)
    torch.testing.assert_close(adv, want)
    valid = adv[inp.mask.bool() & ~torch.isnan(inp.scores)[:, None]].tolist()
    assert statistics.mean(valid) == pytest.approx(0.0, abs=1e-12)
    v = statistics.variance(xs)  # the whitened variance is v / (v + 1e-8), exactly; float64 rounding ~1e-15
    assert statistics.variance(valid) == pytest.approx(v / (v + 1e-8), rel=1e-12)


def test_reinforce_pp_is_global_not_per_group():
    inp, _ = hand_batch()
    regrouped = AdvantageInputs(inp.scores, inp.mask, 3, token_rewards=inp.token_rewards)
    adv, _ = ADVANTAGES.get("reinforce_pp")(inp, cfg(gamma=0.5))
    torch.testing.assert_close(ADVANTAGES.get("reinforce_pp")(regrouped, cfg(gamma=0.5))[0], adv)  # G is irrelevant
    assert adv[1, :2].sum().item() < -0.5  # not centred per sequence: row 1's returns are below the batch mean


# ---------------------------------------------------------------- REINFORCE++-baseline


def naive_rpp_baseline(scores, mask, tr, G):
    """Loop reference: R_i = score + sum of valid token rewards, minus the mean R of its group's scorable samples,
    one value per valid token, whitened with the mean and the unbiased variance of those tokens (+ 1e-8)."""
    B, T = mask.shape
    R = [float(scores[b]) + sum(float(tr[b, t]) for t in range(T) if mask[b, t]) for b in range(B)]
    centred = []
    for b in range(B):
        group = [R[j] for j in range(b - b % G, b - b % G + G) if not math.isnan(R[j])]
        centred.append(0.0 if math.isnan(R[b]) or len(group) < 2 else R[b] - sum(group) / len(group))
    cells = [(b, t) for b in range(B) for t in range(T) if mask[b, t] and not math.isnan(R[b])]
    xs = [centred[b] for b, _ in cells]
    mu = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1) + 1e-8)
    adv = torch.zeros(B, T, dtype=torch.float64)
    ret = torch.zeros(B, T, dtype=torch.float64)
    for b, t in cells:
        adv[b, t] = (centred[b] - mu) / sd
        ret[b, t] = R[b]
    return adv, ret


def rppb_hand_batch():
    """P = 2 groups of G = 3; row 2 is unscorable.  Outcome rewards R = score + sum of valid token rewards:
    group 0: R = [1 - 0.25 - 0.25, 0, NaN] = [0.5, 0, NaN] -> mean 0.25 (NaN excluded) -> centred [0.25, -0.25, 0]
    group 1: R = [3, 1, 2]                                 -> mean 2                    -> centred [1, -1, 0]
    """
    scores = torch.tensor([1.0, 0.0, NAN, 3.0, 1.0, 2.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    tr = torch.zeros(6, 3, dtype=torch.float64)
    tr[0] = torch.tensor([-0.25, -0.25, 7.0])  # 7.0 under the mask
    tr[2] = torch.tensor([5.0, 5.0, 5.0])  # rewards of the unscorable row
    return AdvantageInputs(scores, mask, 3, token_rewards=tr)


def test_reinforce_pp_baseline_hand():
    inp = rppb_hand_batch()
    adv, ret = ADVANTAGES.get(RPPB)(inp, cfg())
    # the centred rewards, one per valid token of the scorable rows (0, 1, 3, 4, 5): 9 tokens, sum -0.75
    xs = [0.25, 0.25, -0.25, 1.0, -1.0, -1.0, 0.0, 0.0, 0.0]
    mu = -1.0 / 12.0  # token-weighted: rows with more tokens weigh more
    var = (sum(x * x for x in xs) - 9 * mu**2) / 8  # unbiased: (sum x^2 - n mu^2) / (n - 1)
    assert mu == pytest.approx(statistics.mean(xs), abs=1e-15) and var == pytest.approx(statistics.variance(xs))
    sd = math.sqrt(var + 1e-8)
    a = [(x - mu) / sd for x in (0.25, -0.25, 1.0, -1.0, 0.0)]
    want = torch.tensor([[a[0], a[0], 0.0], [a[1], 0.0, 0.0], [0.0, 0.0, 0.0],
                         [a[2], 0.0, 0.0], [a[3], a[3], 0.0], [a[4], a[4], a[4]]], dtype=torch.float64)
    torch.testing.assert_close(adv, want)  # float64: rounding ~1e-16
    assert adv[5, 0] > 0  # centred to 0, then shifted by the whitening mean, as verl
    want_ret = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0],
                             [3.0, 0.0, 0.0], [1.0, 1.0, 0.0], [2.0, 2.0, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(ret, want_ret)  # ret = R_i, before centring and whitening
    kept = adv[(inp.mask != 0) & ~torch.isnan(inp.scores)[:, None]].tolist()
    assert statistics.mean(kept) == pytest.approx(0.0, abs=1e-12)
    assert statistics.variance(kept) == pytest.approx(var / (var + 1e-8), rel=1e-12)


@pytest.mark.parametrize("G", [1, 2, 3, 6])
@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_pp_baseline_vs_naive_loop(G, seed):
    scores, mask, tr, _ = ragged(B=12, T=6, seed=20 + seed, holes=True)
    scores[[1, 7]] = NAN
    scores[8:10] = scores[8].item()  # equal scores (their token rewards still differ)
    adv, ret = ADVANTAGES.get(RPPB)(AdvantageInputs(scores, mask, G, token_rewards=tr), cfg())
    want_adv, want_ret = naive_rpp_baseline(scores, mask, tr, G)
    torch.testing.assert_close(adv, want_adv)
    torch.testing.assert_close(ret, want_ret)
    if G == 1:  # a group of one is its own baseline: every sequence is centred to 0, so all of adv is 0
        assert (adv == 0).all()


def test_reinforce_pp_baseline_degenerate_groups_and_whole_batch():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]])
    scores = torch.tensor([0.3, 0.3, 0.7, NAN], dtype=torch.float64)  # group 0 all equal, group 1 one valid sample
    adv, ret = ADVANTAGES.get(RPPB)(AdvantageInputs(scores, mask, 2), cfg())
    assert (adv == 0).all()  # every centred value is exactly 0, so the batch mean and variance are 0 as well
    torch.testing.assert_close(ret, torch.tensor([[0.3, 0.3, 0.0], [0.3, 0.0, 0.0], [0.7, 0.7, 0.7], [0.0] * 3],
                                                 dtype=torch.float64))
    one = AdvantageInputs(torch.tensor([1.0, 0.0]), torch.tensor([[1, 0], [0, 0]]), 2)  # one valid token in all
    adv, ret = ADVANTAGES.get(RPPB)(one, cfg())
    assert adv.tolist() == [[0.0, 0.0], [0.0, 0.0]]  # variance of one token is 0 here (verl's masked_var raises)
    assert ret.tolist() == [[1.0, 0.0], [0.0, 0.0]]


def test_reinforce_pp_baseline_unscorable_sample_changes_nothing_else():
    inp = rppb_hand_batch()
    adv, ret = ADVANTAGES.get(RPPB)(inp, cfg())
    assert (adv[2] == 0).all() and (ret[2] == 0).all()
    mask, tr = inp.mask.clone(), inp.token_rewards.clone()
    mask[2] = torch.tensor([1, 0, 0])  # another length and other rewards for the unscorable row
    tr[2] = torch.tensor([-INF, NAN, 1e30], dtype=torch.float64)
    adv2, ret2 = ADVANTAGES.get(RPPB)(AdvantageInputs(inp.scores, mask, 3, token_rewards=tr), cfg())
    torch.testing.assert_close(adv2, adv)
    torch.testing.assert_close(ret2, ret)
    # a NaN sample weighs like a sample scoring its group's mean with no token: neither moves a mean nor a token
    scores, mask = inp.scores.clone(), inp.mask.clone()
    scores[2], mask[2] = 0.25, 0
    adv3, ret3 = ADVANTAGES.get(RPPB)(AdvantageInputs(scores, mask, 3, token_rewards=inp.token_rewards), cfg())
    torch.testing.assert_close(adv3, adv)
    torch.testing.assert_close(ret3, ret)


def test_reinforce_pp_baseline_permutation_equivariance():
    scores, mask, tr, _ = ragged(B=12, T=5, seed=30, holes=True)
    scores[4] = NAN
    G = 4
    base = ADVANTAGES.get(RPPB)(AdvantageInputs(scores, mask, G, token_rewards=tr), cfg())
    within = torch.cat([torch.randperm(G, generator=torch.Generator().manual_seed(p)) + p * G for p in range(3)])
    groups = torch.tensor([8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7])  # whole groups moved, each still contiguous
    for perm in (within, groups, within[groups]):
        got = ADVANTAGES.get(RPPB)(AdvantageInputs(scores[perm], mask[perm], G, token_rewards=tr[perm]), cfg())
        for x, y in zip(got, base):  # rows follow their sequence; float64 sums in another order: rounding ~1e-16
            torch.testing.assert_close(x, y[perm])
    split = ADVANTAGES.get(RPPB)(AdvantageInputs(scores, mask, 2, token_rewards=tr), cfg())[0]
    assert not torch.allclose(split, base[0])  # but regrouping changes the baselines


def test_reinforce_pp_baseline_relations_to_other_estimators():
    scores, mask, tr, _ = ragged(B=8, T=6, seed=40)
    scores[5] = NAN
    inp = AdvantageInputs(scores, mask, 4, token_rewards=tr)
    adv, ret = ADVANTAGES.get(RPPB)(inp, cfg())
    centred, _ = ADVANTAGES.get("group_mean")(inp, cfg())  # the same centring, not whitened
    keep = (mask != 0) & ~torch.isnan(scores)[:, None]
    xs = centred[keep].tolist()
    mu, sd = statistics.mean(xs), math.sqrt(statistics.variance(xs) + 1e-8)
    torch.testing.assert_close(adv[keep], (centred[keep] - mu) / sd)
    plain = AdvantageInputs(scores, mask, 4)  # no token rewards: ret is the score, as reinforce_pp's with gamma = 1
    torch.testing.assert_close(ADVANTAGES.get(RPPB)(plain, cfg())[1], ADVANTAGES.get("reinforce_pp")(plain, cfg())[1])
    assert not torch.allclose(ADVANTAGES.get(RPPB)(plain, cfg())[0], adv)  # the KL-in-reward term moves R


# ---------------------------------------------------------------- NaN handling and invariance (token level)


@pytest.mark.parametrize("name", TOKEN_LEVEL)
def test_unscorable_and_empty_sequences(name):
    inp, _ = hand_batch()
    scores = torch.cat([inp.scores, torch.tensor([5.0], dtype=torch.float64)])
    mask = torch.cat([inp.mask, torch.zeros(1, 3, dtype=torch.long)])  # an empty response
    tr = torch.cat([inp.token_rewards, torch.full((1, 3), NAN, dtype=torch.float64)])
    values = torch.cat([inp.values, torch.full((1, 3), INF, dtype=torch.float64)])
    full = AdvantageInputs(scores, mask, 1, token_rewards=tr, values=values, baseline=0.2)
    c = cfg(gamma=0.5, whiten_adv=True)
    adv, ret = ADVANTAGES.get(name)(full, c)
    assert (adv[2:] == 0).all()  # adv 0 at every token of the unscorable and of the empty sequence
    want_ret2 = inp.values[2] if name == "gae" else torch.zeros(3, dtype=torch.float64)
    torch.testing.assert_close(ret[2], want_ret2)
    assert (ret[3] == 0).all()
    # excluded from every batch statistic: the scorable rows alone give the same result
    alone = AdvantageInputs(inp.scores[:2], inp.mask[:2], 1, token_rewards=inp.token_rewards[:2],
                            values=inp.values[:2], baseline=0.2)
    adv2, ret2 = ADVANTAGES.get(name)(alone, c)
    torch.testing.assert_close(adv[:2], adv2)
    torch.testing.assert_close(ret[:2], ret2)


@pytest.mark.parametrize("name", ["group_norm", "group_mean", "rloo", *TOKEN_LEVEL, RPPB])
def test_junk_under_mask_changes_nothing(name):
    scores, mask, tr, values = ragged(B=6, T=5, seed=12, holes=True)
    c = cfg(gamma=0.9, lam=0.7, lam_critic=0.9, whiten_adv=True, baseline="batch_mean")
    base = ADVANTAGES.get(name)(AdvantageInputs(scores, mask, 3, token_rewards=tr, values=values), c)
    junk_tr, junk_v = tr.clone(), values.clone()
    k = int((mask == 0).sum())
    junk = torch.tensor([NAN, INF, -INF, 1e30, -7.0], dtype=torch.float64).repeat(k)[:k]
    junk_tr[mask == 0] = junk.roll(1)
    junk_v[mask == 0] = junk
    got = ADVANTAGES.get(name)(AdvantageInputs(scores, mask.bool(), 3, token_rewards=junk_tr, values=junk_v), c)
    for x, y in zip(got, base):
        assert torch.isfinite(x).all()
        torch.testing.assert_close(x, y)


def test_token_level_float32_and_int_scores():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv, ret = ADVANTAGES.get("reinforce")(AdvantageInputs(torch.tensor([1, 0]), mask, 2), cfg(baseline="none"))
    assert adv.dtype == torch.float32
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))


def test_inputs_validation():
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="scores"):
        AdvantageInputs(torch.zeros(2, 1), mask, 1)
    with pytest.raises(ValueError, match="mask"):
        AdvantageInputs(torch.zeros(3), mask, 1)
    with pytest.raises(ValueError, match="mask"):
        AdvantageInputs(torch.zeros(2), torch.ones(2), 1)
    with pytest.raises(ValueError, match="token_rewards"):
        AdvantageInputs(torch.zeros(2), mask, 1, token_rewards=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="values"):
        AdvantageInputs(torch.zeros(2), mask, 1, values=torch.zeros(3, 3))
