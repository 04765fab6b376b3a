"""Sampling metrics: unbiased pass@k, majority-vote maj@k and verifier-picked best-of-N.

pass@k: Chen et al. 2021 ("Evaluating Large Language Models Trained on Code"),
eq. 1: with n samples of which c are correct,
    pass@k = 1 - C(n - c, k) / C(n, k),
computed as the product 1 - prod_{i = n-c+1}^{n} (1 - k / i), which never forms
the (huge) binomial coefficients.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence


def _check_counts(n: int, c: int, k: int) -> None:
    if min(n, c, k) < 0:
        raise ValueError(f"pass@k needs non-negative n, c, k; got n={n}, c={c}, k={k}")
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={k}")
    if k > n:
        raise ValueError(f"pass@k needs k <= n (samples drawn); got k={k}, n={n}")
    if c > n:
        raise ValueError(f"pass@k needs c <= n (correct among samples); got c={c}, n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, eq. 1)."""
    _check_counts(n, c, k)
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean of ``pass_at_k(n, c, k)`` over problems given as (n, c) pairs."""
    if len(counts) == 0:
        raise ValueError("mean_pass_at_k needs at least one (n, c) pair")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool]) -> float:
    """1.0 if the most frequent non-None answer is correct, else 0.0.

    Ties go to the answer seen first; all-None gives 0.0.  ``correct[i]`` says
    whether ``answers[i]`` is right; the first occurrence of the winner decides.
    """
    if len(answers) != len(correct):
        raise ValueError(f"answers and correct differ in length: {len(answers)} vs {len(correct)}")
    votes = Counter(a for a in answers if a is not None)  # insertion-ordered
    if not votes:
        return 0.0
    winner = max(votes, key=votes.__getitem__)  # max keeps the first of equal counts
    return 1.0 if correct[answers.index(winner)] else 0.0


def best_of_n(scores: Sequence[float | None], correct: Sequence[bool]) -> float:
    """1.0 if the sample a verifier scores highest is correct, else 0.0 (best-of-N with a verifier).

    ``scores[i]`` is the verifier's value of sample ``i`` (None or NaN: no verdict, never picked while another
    sample has one); ties go to the sample drawn first; no verdict at all picks the first sample.
    ``correct[i]`` says whether sample ``i`` is right by the task's rule.
    """
    if len(scores) != len(correct):
        raise ValueError(f"scores and correct differ in length: {len(scores)} vs {len(correct)}")
    if not scores:
        raise ValueError("best_of_n needs at least one sample")
    judged = [(s, -i) for i, s in enumerate(scores) if s is not None and s == s]  # NaN != NaN
    pick = -max(judged)[1] if judged else 0
    return 1.0 if correct[pick] else 0.0
