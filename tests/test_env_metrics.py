"""``env/success`` and ``env/reward/mean`` (rlft.rollout.episodes.episode_metrics): success is the share of scored
trajectories whose environment reward reaches 1 (the held-out rule's "correct"), never partial credit; the mean
counts the partial credit. By hand, and from trajectories of a scripted rollout."""

from __future__ import annotations

import pytest

from rlft.envs import Step
from rlft.rollout.episodes import episode_metrics
from rlft.rollout.multiturn import multiturn_rollout
from test_multiturn import Scripted, limits
from test_rl_loop import tok  # noqa: F401  (fixture)


def episode(reward, *, truncated=False, error=None) -> dict:
    return {"turns": 1, "truncated": truncated, "error": error, "env_reward": reward, "turn_rewards": [],
            "tools": {}, "tool_errors": 0, "malformed_calls": 0, "segments": [], "role_rewards": {}}


def test_success_counts_full_success_only():
    episodes = [episode(1.0), episode(0.5), episode(0.99), episode(0.0), episode(1.0), episode(2.0),
                episode(None, truncated=True),  # cut before a verdict: scored 0, a game not finished is not won
                episode(None),  # no verdict at all: unscorable, left out
                episode(1.0, error="RuntimeError: step broke")]  # the environment failed: left out
    m = episode_metrics(episodes)
    # scored: 1, 0.5, 0.99, 0, 1, 2, 0 -> reaching 1: three of seven
    assert m["env/success"] == pytest.approx(3 / 7, abs=1e-15)
    assert m["env/reward/mean"] == pytest.approx((1 + 0.5 + 0.99 + 0 + 1 + 2 + 0) / 7, abs=1e-15)
    assert m["env/errors"] == 1.0


@pytest.mark.parametrize("partial", [0.5, 0.999999, 1e-9])
def test_partial_credit_alone_is_no_success(partial):
    m = episode_metrics([episode(partial)] * 4)
    assert m["env/success"] == 0.0 and m["env/reward/mean"] == pytest.approx(partial, rel=1e-15)


class Graded:
    """Ends at the first turn with ``reward``: a partial score for a near miss, 1 for a solve."""

    def __init__(self, reward: float):
        self.reward = reward

    def reset(self, sample):
        return None

    def step(self, text):
        return Step(None, self.reward, True)


def test_trajectories_with_partial_credit_are_not_successes(tok):
    made = iter([Graded(1.0), Graded(0.25), Graded(0.75), Graded(1.0)])
    prompts = [tok("Q: go\nA: ", add_special_tokens=False)["input_ids"]] * 2
    batch, trajs = multiturn_rollout(
        tok, prompts, [{"ground_truth": "7"}] * 2, [({"role": "user", "content": "go"},)] * 2,
        make_env=lambda sample: next(made), limits=limits(), group_size=2, sample_turn=Scripted(tok, [["#### 7$"]] * 4),
        stops=[tok.eos_token_id], chat=False)
    assert [t.reward for t in trajs] == [1.0, 0.25, 0.75, 1.0]
    m = episode_metrics(batch.episodes)
    assert m["env/success"] == 0.5 and m["env/reward/mean"] == 0.75
