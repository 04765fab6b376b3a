"""What a batch of trajectories did, as metrics: ``env/*`` (turns, errors, truncations, the environment's verdicts)
and ``tool/*`` (calls per tool, errors), from each trajectory's record (``rlft.rollout.multiturn.Trajectory.record``)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rlft.rewards.env import env_reward

logger = logging.getLogger("rlft.rollout")


def episode_metrics(episodes: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``env/*`` and ``tool/*`` metrics of a batch's trajectories (``Trajectory.record`` of each)."""
    if not episodes:
        return {}
    n = len(episodes)
    verdicts = [env_reward("", {"env_reward": e["env_reward"], "env_truncated": e["truncated"]})  # the term's rule
                for e in episodes if e["error"] is None]
    rewarded = [r for r in verdicts if r is not None]
    calls = Counter()
    for e in episodes:
        calls.update(e["tools"])
    out = {"env/turns/mean": sum(e["turns"] for e in episodes) / n,
           "env/errors": float(sum(e["error"] is not None for e in episodes)),
           "env/failed_frac": sum(e["error"] is not None for e in episodes) / n,  # what health stops a run on
           "env/truncated": sum(bool(e["truncated"]) for e in episodes) / n,
           "tool/calls/mean": (sum(calls.values()) + sum(e["malformed_calls"] for e in episodes)) / n,
           "tool/errors": float(sum(e["tool_errors"] for e in episodes)),
           **{f"tool/{name}/calls": float(k) for name, k in sorted(calls.items())}}
    if rewarded:
        out["env/success"] = sum(r >= 1.0 for r in rewarded) / len(rewarded)  # the held-out rule's "correct"
        out["env/reward/mean"] = sum(rewarded) / len(rewarded)
    out.update(gateway_metrics(episodes))
    errors = [e["error"] for e in episodes if e["error"] is not None]
    if errors:
        logger.warning("the environment cost %d of %d trajectories; first: %s", len(errors), n, errors[0])
    return out


def gateway_metrics(episodes: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``gateway/*`` of the episodes an agent played through the gateway (``rlft.rollout.agent``; {} for none):
    calls answered, tokens sampled, mean seconds from a call's arrival to its answer, prefix breaks, episodes
    lost, sessions."""
    played = [e for e in episodes if "gateway" in e]
    if not played:
        return {}
    latency = [x for e in played for x in e["gateway"]["latency_s"]]
    return {"gateway/requests": float(sum(e["gateway"]["requests"] for e in played)),
            "gateway/tokens": float(sum(e["gateway"]["tokens"] for e in played)),
            "gateway/latency_s": sum(latency) / len(latency) if latency else 0.0,
            "gateway/prefix_breaks": float(sum(e["gateway"]["prefix_breaks"] for e in played)),
            "gateway/errors": float(sum(e["error"] is not None for e in played)),
            "gateway/sessions": float(len(played))}
