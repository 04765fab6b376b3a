import math
import statistics

import pytest
import torch

from rlft.core.advantages import ADVANTAGES, group_mean, group_norm, group_stats, rloo

NAN = float("nan")


# ---------------------------------------------------------------- hand-computed


def test_registry_names():
    assert {"group_norm", "group_mean", "rloo"} <= set(ADVANTAGES.names())
    assert ADVANTAGES.get("group_norm") is group_norm


def test_group_norm_unbiased_std_convention():
    adv = group_norm(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4)
    s = 0.5 / math.sqrt(1.0 / 3.0)  # std with Bessel's correction is sqrt(1/3)
    assert s == pytest.approx(0.866, abs=1e-3)
    torch.testing.assert_close(adv, torch.tensor([s, -s, -s, s]), atol=1e-5, rtol=1e-5)


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
    s = 0.5 / math.sqrt(1.0 / 3.0)
    torch.testing.assert_close(group_norm(scores, 5), torch.tensor([s, 0.0, -s, -s, s]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rloo(scores, 5), torch.tensor([2 / 3, 0.0, -2 / 3, -2 / 3, 2 / 3]))
    torch.testing.assert_close(group_mean(scores, 5), torch.tensor([0.5, 0.0, -0.5, -0.5, 0.5]))
    mean, _, _ = group_stats(scores, 5)
    assert mean.item() == pytest.approx(0.5)


def test_not_divisible_raises():
    with pytest.raises(ValueError, match="divisible"):
        group_norm(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="divisible"):
        group_stats(torch.zeros(5), 2)


def test_integer_scores_accepted():
    torch.testing.assert_close(rloo(torch.tensor([1, 0, 0, 1]), 4), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))


# ---------------------------------------------------------------- naive loops


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


@pytest.mark.parametrize("kind", ["group_norm", "group_mean", "rloo"])
def test_vs_naive_loop(kind):
    g = torch.Generator().manual_seed(0)
    P, G = 7, 5
    scores = torch.randn(P * G, generator=g, dtype=torch.float64)
    scores[torch.rand(P * G, generator=g) < 0.3] = NAN
    scores[:G] = 1.0  # a zero-std group
    got = ADVANTAGES.get(kind)(scores, G).tolist()
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


# ---------------------------------------------------------------- invariance


@pytest.mark.parametrize("kind", ["group_norm", "group_mean", "rloo"])
def test_other_groups_and_permutation_invariance(kind):
    fn = ADVANTAGES.get(kind)
    scores = torch.tensor([1.0, 0.0, 0.5, NAN, 0.2, 0.9, 0.9, 0.1])
    base = fn(scores, 4)
    changed = scores.clone()
    changed[4:] = torch.tensor([5.0, -3.0, NAN, 2.0])  # another group: no effect on group 0
    torch.testing.assert_close(fn(changed, 4)[:4], base[:4])
    perm = torch.tensor([2, 0, 3, 1])  # permuting within a group permutes the advantages
    torch.testing.assert_close(fn(scores[:4][perm], 4), base[:4][perm])
