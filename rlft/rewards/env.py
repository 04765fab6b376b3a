"""``env_reward``: the verdict an environment gave its trajectory (a game won or lost), as a reward term.

A multi-turn rollout (``env.name`` set) puts each trajectory's reward from its environment (the ``reward`` of
its last ``Step`` that had one) in the sample as ``env_reward``; this term returns it, so it is weighted, logged
as ``reward/env_reward/mean`` and combined with the run's other rewards like any of them. A trajectory whose
environment gave no reward is unscorable for this term (None), never a silent 0.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlft.rewards.base import REWARDS


@REWARDS.register("env_reward")
def env_reward(completion: str, sample: Mapping) -> float | None:
    """The environment's reward of this trajectory.

    >>> env_reward("42", {"env_reward": 1.0})
    1.0
    >>> env_reward("42", {}) is None
    True
    """
    value = sample.get("env_reward")
    return None if value is None else float(value)
