"""Verifiable rewards: plain per-sample functions ``fn(completion, sample) -> float | None``.

``None`` means unscorable (excluded from the group baseline), never "wrong".
Functions live in submodules and register themselves in ``REWARDS``; the
trainer looks them up by name and scores with ``score_batch``.
"""

from rlft.registry import Registry

REWARDS = Registry("reward function")

from rlft.rewards.math import (  # noqa: E402  (registers the math rewards)
    extract_final,
    extract_flexible,
    final_answer,
    format_final,
    extract_strict,
    format_reward,
    gsm8k_flexible,
    gsm8k_strict,
    numbers_equal,
)
from rlft.rewards.scoring import RewardTimeout, ScoreResult, score_batch  # noqa: E402
from rlft.rewards.symbolic import extract_math_answer, math_equal, math_reward  # noqa: E402  (registers math)

__all__ = [
    "REWARDS",
    "RewardTimeout",
    "ScoreResult",
    "extract_flexible",
    "extract_math_answer",
    "extract_strict",
    "format_reward",
    "gsm8k_flexible",
    "gsm8k_strict",
    "math_equal",
    "math_reward",
    "numbers_equal",
    "score_batch",
]
