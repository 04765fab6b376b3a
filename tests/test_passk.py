import itertools
import math

import pytest

from rlft.core.passk import best_of_n, maj_at_k, mean_pass_at_k, pass_at_k


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


def test_best_of_n_hand():
    # the verifier's favourite (0.9, sample 2) is right; then wrong; ties go to the first drawn
    assert best_of_n([0.1, 0.5, 0.9], [False, False, True]) == 1.0
    assert best_of_n([0.1, 0.9, 0.5], [True, False, True]) == 0.0
    assert best_of_n([0.7, 0.7, 0.2], [True, False, False]) == 1.0
    assert best_of_n([0.7, 0.7, 0.2], [False, True, True]) == 0.0
    # no verdict: never picked over a scored sample; none at all: the first sample
    assert best_of_n([None, 0.0, float("nan")], [True, False, True]) == 0.0
    assert best_of_n([None, float("nan")], [True, False]) == 1.0
    with pytest.raises(ValueError, match="differ in length"):
        best_of_n([1.0], [True, False])
    with pytest.raises(ValueError, match="at least one"):
        best_of_n([], [])


def test_best_of_n_vs_naive_loop_and_unscored_values_change_nothing():
    import random

    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 6)
        scores = [rng.choice([None, float("nan"), 0.0, 0.5, 1.0, rng.random()]) for _ in range(n)]
        correct = [rng.random() < 0.5 for _ in range(n)]
        best, pick = None, 0
        for i, s in enumerate(scores):  # the first strictly larger verdict wins
            if s is None or math.isnan(s):
                continue
            if best is None or s > best:
                best, pick = s, i
        assert best_of_n(scores, correct) == float(correct[pick])
        # an unscored sample's correctness never matters while another sample is scored
        if best is not None:
            flipped = [(not c) if (s is None or s != s) else c for s, c in zip(scores, correct)]
            assert best_of_n(scores, flipped) == best_of_n(scores, correct)


def test_best_of_with_the_rule_as_verifier_is_the_oracle():
    """With the correctness rule itself as the verifier, best-of-N is right exactly when some sample is."""
    import random

    rng = random.Random(5)
    for _ in range(100):
        correct = [rng.random() < 0.3 for _ in range(rng.randint(1, 8))]
        assert best_of_n([1.0 if c else 0.0 for c in correct], correct) == float(any(correct))
