import itertools
import math

import pytest

from rlft.core.passk import maj_at_k, mean_pass_at_k, pass_at_k


def test_hand_values():
    assert pass_at_k(10, 1, 1) == pytest.approx(0.1)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k
    assert pass_at_k(4, 2, 4) == 1.0


def test_vs_brute_force_subsets():
    for n in range(1, 8):
        for c in range(n + 1):
            samples = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                want = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12), (n, c, k)


def test_vs_binomial_for_large_n():
    n, c, k = 200, 17, 50
    want = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(want, rel=1e-12)
    assert pass_at_k(10_000, 1, 100) == pytest.approx(0.01, rel=1e-9)


@pytest.mark.parametrize("n,c,k", [(3, 1, 4), (3, 4, 1), (-1, 0, 1), (3, -1, 1), (3, 1, -1), (3, 1, 0)])
def test_invalid_raise(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_pass_at_k():
    assert mean_pass_at_k([(10, 1), (5, 2), (4, 0)], 1) == pytest.approx((0.1 + 0.4 + 0.0) / 3)
    with pytest.raises(ValueError):
        mean_pass_at_k([], 1)


def test_maj_at_k():
    assert maj_at_k(["4", "5", "4", None], [True, False, True, False]) == 1.0
    assert maj_at_k(["5", "4", "5", "4"], [False, True, False, True]) == 0.0  # tie -> first seen ("5")
    assert maj_at_k(["4", "5", "5", "4"], [True, False, False, True]) == 1.0  # tie -> first seen ("4")
    assert maj_at_k([None, None, "7", None], [False, False, True, False]) == 1.0  # None never wins
    assert maj_at_k([None, None], [False, False]) == 0.0
    assert maj_at_k([], []) == 0.0
    with pytest.raises(ValueError):
        maj_at_k(["1"], [True, False])
