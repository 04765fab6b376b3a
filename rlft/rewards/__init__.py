"""Rewards: per-sample ``fn(completion, sample) -> float | None``, group-level and batched functions.

``None`` means unscorable (excluded from the group baseline), never "wrong".
Functions live in submodules, one per family, and register themselves in
``REWARDS`` (see ``rlft.rewards.base`` for the four shapes and for parameters);
the trainer builds them from ``reward.fns`` and scores with ``score_batch``.
"""

from rlft.rewards.base import (  # noqa: F401
    REWARDS, batched, group_level, is_batched, is_group_level, is_step_level, step_level)

from rlft.rewards.math import (  # noqa: E402  (registers the GSM8K-style rewards)
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
from rlft.rewards.scoring import RewardTimeout, ScoreResult, call_with_timeout, score_batch  # noqa: E402
from rlft.rewards.symbolic import extract_math_answer, math_equal, math_reward  # noqa: E402  (registers math)
from rlft.rewards import group, formats, cor, shaping, code, model, judge, custom, chain, prm, env  # noqa: E402,F401  (each registers its family)

__all__ = [
    "REWARDS",
    "RewardTimeout",
    "call_with_timeout",
    "ScoreResult",
    "batched",
    "extract_flexible",
    "extract_math_answer",
    "extract_strict",
    "format_reward",
    "group_level",
    "gsm8k_flexible",
    "gsm8k_strict",
    "math_equal",
    "math_reward",
    "numbers_equal",
    "score_batch",
]
