"""``env_reward``: the verdict an environment gave its trajectory (a game won or lost), as a reward term.

A multi-turn rollout (``env.name`` set) puts each trajectory's reward from its environment (the ``reward`` of
its last ``Step`` that had one) in the sample as ``env_reward``; this term returns it, so it is weighted, logged
as ``reward/env_reward/mean`` and combined with the run's other rewards like any of them. A trajectory cut by a
limit (turns, tokens) before the environment gave a verdict scores 0.0, as a game not finished is not won (and
as an overlong single-turn response scores what its text earns); one that ended without any verdict is
unscorable for this term (None), never a silent 0.

``env_turns`` is its step-level sibling: every reward the environment gave during the trajectory, each at the
end of the policy turn it answered (the trajectory's ``turn_rewards``: ``(end_char, reward)``), for
``algo.advantage=process`` (process supervision with steps = turns).
"""

from __future__ import annotations

from collections.abc import Mapping

from rlft.rewards.base import REWARDS, step_level


@REWARDS.register("env_reward")
def env_reward(completion: str, sample: Mapping) -> float | None:
    """The environment's reward of this trajectory.

    >>> env_reward("42", {"env_reward": 1.0})
    1.0
    >>> env_reward("42", {}) is None
    True
    >>> env_reward("42", {"env_reward": None, "env_truncated": True})
    0.0
    """
    value = sample.get("env_reward")
    if value is None and sample.get("env_truncated"):
        return 0.0  # cut by a limit before any verdict: a game not finished is not won
    return None if value is None else float(value)


@REWARDS.register("env_turns")
@step_level
def env_turns(completion: str, sample: Mapping) -> list[tuple[int, float | None]]:
    """The environment's reward of each turn it scored, at the end of that turn in ``completion``.

    >>> env_turns("ab", {"env_turn_rewards": [[1, 0.5], [2, 1.0]]})
    [(1, 0.5), (2, 1.0)]
    """
    return [(int(end), None if r is None else float(r)) for end, r in sample.get("env_turn_rewards") or []]
