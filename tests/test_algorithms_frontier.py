"""The issue-34 losses, advantage, aggregation and token masking train 20 steps on the embedded task with finite
metrics (the formulas themselves: tests/test_trust_region_losses.py)."""

from __future__ import annotations

import math

import pytest

from test_algorithms import finite_keys, run  # noqa: F401  (the fixture: a short demo run on the tiny model)

STEPS = ["train.steps=20", "algo.epochs=2"]  # two passes: the second sees ratios != 1
ACTOR = ["actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/grad_norm"]

CASES = {
    "cispo": ["algo=cispo"],
    "gmpo": ["algo=gmpo"],
    "sapo": ["algo.policy_loss=sapo", "algo.loss_agg=seq-mean-token-mean"],
    "dppo_tv": ["algo.policy_loss=dppo_tv", "algo.clip_low=0.15", "algo.clip_high=0.15", "algo.clip_c=20"],
    "dppo_kl": ["algo.policy_loss=dppo_kl", "algo.clip_low=0.05", "algo.clip_high=0.05", "algo.clip_c=20"],
    "clip_cov": ["algo.policy_loss=clip_cov", "algo.clip_cov_ratio=0.05"],
    "kl_cov": ["algo.policy_loss=kl_cov", "algo.kl_cov_ratio=0.05"],
    "token_sum": ["algo.loss_agg=token-sum", "optim.lr=1e-4"],
    "entropy_top": ["algo.entropy_top_frac=0.2"],
    "maxrl": ["algo.advantage=maxrl", "reward.fns=[test_digit_share]", "reward.weights=[1.0]"],
}
EXTRA = {"sapo": ["actor/sapo_gate"], "clip_cov": ["actor/cov_clipfrac"], "kl_cov": ["actor/cov_klfrac"],
         "entropy_top": ["actor/entropy_top_kept"]}


@pytest.mark.parametrize("case", list(CASES))
def test_trains_20_steps_with_finite_metrics(run, case):
    _, records, cfg = run(*STEPS, *CASES[case], name=case)
    assert len(records) == 20
    finite_keys(records, ACTOR + EXTRA.get(case, []))
    assert all(math.isfinite(r["reward/mean"]) for r in records)
    if case == "entropy_top":
        assert all(0.19 <= r["actor/entropy_top_kept"] <= 1.0 for r in records)  # ceil(0.2 n) of n tokens, ties kept


def test_gdpo_gets_each_reward_component_and_trains_20_steps(run, monkeypatch):
    """score() records every component unweighted (Batch.reward_parts), the weights reach the estimator, and the
    weighted sum of the components is the batch's score."""
    import torch

    from rlft.core.advantages import ADVANTAGES

    real, seen = ADVANTAGES.get("gdpo"), []

    def spy(inp, cfg):
        seen.append((inp.reward_parts.clone(), inp.reward_weights, inp.scores.clone()))
        return real(inp, cfg)

    monkeypatch.setitem(ADVANTAGES._items, "gdpo", spy)
    _, records, cfg = run(*STEPS, "algo.advantage=gdpo", name="gdpo")
    assert len(records) == 20 and len(seen) == 20
    finite_keys(records, ACTOR)
    for parts, weights, scores in seen:
        assert parts.shape == (len(scores), 3) and weights == (1.0, 0.1, 1.0)  # final_answer, format_final, digits
        ok = ~torch.isnan(scores)
        combined = (parts * torch.tensor(weights)).sum(-1)
        torch.testing.assert_close(combined[ok], scores[ok].to(combined.dtype), rtol=0, atol=1e-6)
