"""The probabilities of the prompt samplers (rlft.core.sampling): hand cases, naive loops, invariances."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.core.sampling import curriculum_fraction, curriculum_probs, prioritised_probs


def test_prioritised_hand_case_floor_and_unknown():
    p = prioritised_probs(torch.tensor([0.0, 0.5, 1.0]), 0.1)  # weights 1, 0.5, 0.1 (the floor) over 1.6
    assert p.tolist() == pytest.approx([0.625, 0.3125, 0.0625])
    q = prioritised_probs(torch.tensor([math.nan, 0.75]), 0.5)  # unknown counts as 0 -> weight 1; 0.25 -> the floor
    assert q.tolist() == pytest.approx([2 / 3, 1 / 3])
    assert prioritised_probs(torch.tensor([0.2, 0.9]), 1.0).tolist() == pytest.approx([0.5, 0.5])  # floor 1: uniform
    with pytest.raises(ValueError, match="floor"):
        prioritised_probs(torch.tensor([0.5]), 0.0)


def test_prioritised_equals_a_naive_loop_and_follows_a_permutation():
    g = torch.Generator().manual_seed(0)
    s = torch.rand(37, generator=g)
    s[::5] = math.nan
    floor = 0.15
    weights = [max(1.0 - (0.0 if math.isnan(x) else x), floor) for x in s.tolist()]
    naive = [w / sum(weights) for w in weights]
    assert prioritised_probs(s, floor).tolist() == pytest.approx(naive, rel=1e-12)
    perm = torch.randperm(37, generator=g)
    # invariance: the order of the prompts changes nothing (up to the order of the normalising sum)
    torch.testing.assert_close(prioritised_probs(s[perm], floor), prioritised_probs(s, floor)[perm], rtol=1e-12, atol=0)


def test_curriculum_fraction_is_linear_from_start_to_one():
    assert [curriculum_fraction(s, 5, 0.2) for s in (1, 2, 3, 4, 5, 9)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    assert curriculum_fraction(1, 1, 0.3) == 1.0 and curriculum_fraction(0, 10, 0.5) == 0.5


def test_curriculum_probs_hand_cases():
    assert curriculum_probs(torch.tensor([0.1, 0.9, 0.5, 0.9]), 0.5).tolist() == [0.0, 0.5, 0.0, 0.5]
    tie = curriculum_probs(torch.tensor([0.9, 0.5, 0.5, 0.1]), 0.5).tolist()  # the pool never splits a tie
    assert tie == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0])
    assert curriculum_probs(torch.tensor([0.9, 0.5, 0.2, 0.1]), 0.25, min_pool=3).tolist() == pytest.approx(
        [1 / 3, 1 / 3, 1 / 3, 0.0])  # at least min_pool prompts
    unknown = curriculum_probs(torch.tensor([math.nan, 0.0, math.nan]), 0.3).tolist()  # NaN ranks below 0
    assert unknown == [0.0, 1.0, 0.0]
    assert curriculum_probs(torch.full((4,), math.nan), 0.25).tolist() == [0.25] * 4  # no estimate: every prompt
    assert curriculum_probs(torch.tensor([0.3, 0.2]), 1.0).tolist() == [0.5, 0.5]


def test_curriculum_probs_equal_a_naive_loop_and_follow_a_permutation():
    g = torch.Generator().manual_seed(1)
    s = (torch.randint(0, 5, (30,), generator=g) / 4).double()  # ties on purpose
    s[3] = math.nan
    for fraction in (0.1, 0.34, 0.5, 0.99, 1.0):
        k = max(math.ceil(fraction * 30), 1)
        key = [-1.0 if math.isnan(x) else x for x in s.tolist()]
        kth = sorted(key, reverse=True)[k - 1]
        pool = [x >= kth for x in key]
        naive = [float(x) / sum(pool) for x in pool]
        assert curriculum_probs(s, fraction).tolist() == pytest.approx(naive)
        perm = torch.randperm(30, generator=g)
        assert torch.equal(curriculum_probs(s[perm], fraction), curriculum_probs(s, fraction)[perm])


def test_doctests():
    import doctest

    import rlft.core.sampling

    assert doctest.testmod(rlft.core.sampling).failed == 0
