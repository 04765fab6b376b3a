import math

import pytest
import torch

from rlft.core.shaping import informative_groups, overlong_filter, soft_overlong_penalty

# ---------------------------------------------------------------- soft overlong penalty (DAPO eq. 13)


def test_soft_overlong_penalty_hand_and_boundaries():
    # L_max = 20, L_cache = 4: free up to 16, linear ramp to -1 at 20, -1 beyond
    lengths = torch.tensor([0, 15, 16, 17, 18, 19, 20, 21, 100])
    out = soft_overlong_penalty(lengths, max_len=20, cache_len=4)
    assert out.dtype == torch.float32 and out.shape == (9,)
    assert out.tolist() == [0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]
    half = soft_overlong_penalty(lengths, max_len=20, cache_len=4, factor=0.5)
    assert half[2].item() == 0.0  # |y| = L_max - L_cache
    assert half[6].item() == -0.5  # |y| = L_max: -1 * factor
    assert half[7].item() == -0.5  # |y| > L_max
    assert half.tolist() == [0.5 * x for x in out.tolist()]
    # L_cache = L_max: the ramp starts at length 0
    assert soft_overlong_penalty(torch.tensor([0, 5, 10, 11]), 10, 10).tolist() == [0.0, -0.5, -1.0, -1.0]


def test_soft_overlong_penalty_vs_naive_and_monotone():
    lengths = torch.randint(0, 40, (64,), generator=torch.Generator().manual_seed(0))
    out = soft_overlong_penalty(lengths, max_len=32, cache_len=7, factor=2.0)
    for y, p in zip(lengths.tolist(), out.tolist()):
        if y <= 25:
            want = 0.0
        elif y <= 32:
            want = (25 - y) / 7
        else:
            want = -1.0
        assert p == pytest.approx(2.0 * want)
    # continuous and non-increasing in the length
    grid = soft_overlong_penalty(torch.arange(0, 40), 32, 7)
    assert (grid[1:] <= grid[:-1]).all()
    assert (grid[:-1] - grid[1:]).max().item() == pytest.approx(1 / 7)


@pytest.mark.parametrize("max_len, cache_len, factor, match", [
    (20, 0, 1.0, "cache_len"), (20, 21, 1.0, "cache_len"), (0, 0, 1.0, "max_len"), (20, 4, -1.0, "factor"),
])
def test_soft_overlong_penalty_validation(max_len, cache_len, factor, match):
    with pytest.raises(ValueError, match=match):
        soft_overlong_penalty(torch.tensor([1]), max_len, cache_len, factor)


# ---------------------------------------------------------------- overlong filtering


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.int64])
def test_overlong_filter(dtype):
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]]).to(dtype)
    before = mask.clone()
    out = overlong_filter(mask, torch.tensor([False, True, False]))
    assert out.dtype == dtype
    assert out.to(torch.int64).tolist() == [[1, 1, 0], [0, 0, 0], [1, 0, 0]]
    assert torch.equal(mask, before)  # the input is not modified
    assert torch.equal(overlong_filter(mask, torch.tensor([0, 0, 0])), mask)  # nothing truncated: unchanged


# ---------------------------------------------------------------- dynamic sampling


def test_informative_groups_hand():
    nan = math.nan
    scores = torch.tensor([
        1, 0, 0, 1,  # mixed: kept
        1, 1, 1, 1,  # all correct
        0, 0, 0, 0,  # all wrong
        nan, 1, nan, nan,  # one valid score
        nan, 1, 0, nan,  # two valid, different: kept
        nan, nan, nan, nan,  # nothing valid
        0.5, 0.5, nan, 0.5,  # valid ones all equal
    ])
    assert informative_groups(scores, 4).tolist() == [True, False, False, False, True, False, False]
    assert informative_groups(torch.tensor([3, 3, 1, 3]), 2).tolist() == [False, True]  # int scores
    assert informative_groups(torch.tensor([1.0, -math.inf, math.inf, math.inf]), 2).tolist() == [True, False]


def test_informative_groups_never_keeps_zero_variance_group():
    g = torch.Generator().manual_seed(1)
    choices = torch.tensor([0.0, 1.0, 0.5, math.nan])
    for G in (2, 3, 4):
        scores = choices[torch.randint(0, 4, (60 * G,), generator=g)]  # (B,)
        keep = informative_groups(scores, G)  # (P,)
        assert keep.shape == (60,) and keep.any() and not keep.all()
        for p, group in enumerate(scores.view(-1, G)):
            valid = group[~torch.isnan(group)]
            informative = valid.numel() >= 2 and valid.var().item() > 0  # naive definition
            assert keep[p].item() == informative


@pytest.mark.parametrize("n, G, match", [(4, 0, "group_size"), (5, 2, "groups of 2")])
def test_informative_groups_validation(n, G, match):
    with pytest.raises(ValueError, match=match):
        informative_groups(torch.zeros(n), G)
