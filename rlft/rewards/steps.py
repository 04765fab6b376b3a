"""Step-level rewards on tokens: where each step ends in the response, and the batch's step tensors.

A step-level reward (``rlft.rewards.base.step_level``) gives ``(end_char, reward)``
per step, offsets in the decoded completion. The RL loop turns them into
``Batch.step_rewards`` (B, T), the reward at the token where a step ends (0
elsewhere), and ``Batch.step_mask`` (B, T), 1 at those tokens, which
``algo.advantage=process`` reads (DeepSeekMath §4.1.3).

- **Token of a step**: the first response token whose decoded prefix
  (``tokenizer.decode(ids[:k], skip_special_tokens=True)``, as the rollout
  decodes the completion) reaches ``end_char``; a step that ends the completion
  (``end_char == len(text)``) is placed on the last valid token, the eos when
  there is one, so every token of the response lies under some step. Works for
  any tokenizer (binary search over decoded prefixes, O(steps x log T) decodes).
- **Several step-level rewards** add up, weighted by their ``reward.fns``
  weights (weight 0: left out); steps of different rewards, or two steps whose
  text ends inside one token, that land on the same token are one step whose
  reward is the weighted sum. An unscorable step (None) makes its token NaN
  (left out of the group statistics by the estimator).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from rlft.models.tokens import step_end_positions

Step = tuple[int, "float | None"]  # (end_char, reward)




def step_tensors(tokenizer, response_ids: Tensor, response_mask: Tensor,
                 steps: Mapping[str, Sequence[Sequence[Step]]], weights: Mapping[str, float]) -> tuple[Tensor, Tensor]:
    """(step_rewards (B, T) float32, step_mask (B, T) long) from each step-level reward's steps per sample."""
    B, T = response_mask.shape
    rewards = torch.zeros(B, T)  # (B, T)
    mask = torch.zeros(B, T, dtype=torch.long)  # (B, T)
    for name, per_sample in steps.items():
        w = weights[name]
        if w == 0:
            continue
        for b, sample_steps in enumerate(per_sample):
            if not sample_steps:
                continue
            ids = response_ids[b][response_mask[b] != 0].tolist()
            positions = step_end_positions(tokenizer, ids, [e for e, _ in sample_steps])
            cols = (response_mask[b] != 0).nonzero().flatten().tolist()  # valid columns, in order
            for pos, (_, r) in zip(positions, sample_steps):
                t = cols[pos]
                rewards[b, t] += math.nan if r is None else w * r
                mask[b, t] = 1
    return rewards, mask


def step_metrics(batches: Sequence[tuple[Tensor, Tensor]]) -> dict[str, float]:
    """``process/steps_per_sample``, ``process/step_reward/mean`` (the step accuracy of a 0/1 checker) and
    ``process/unscorable_step_frac`` over ``(step_rewards, step_mask)`` (B, T) pairs; {} when there are none."""
    if not batches:
        return {}
    vals = torch.cat([r[m != 0] for r, m in batches])  # (steps,)
    ok = vals[~torch.isnan(vals)]
    n, n_samples = vals.numel(), sum(m.shape[0] for _, m in batches)
    return {"process/steps_per_sample": n / max(n_samples, 1),
            "process/step_reward/mean": ok.mean().item() if ok.numel() else 0.0,
            "process/unscorable_step_frac": 1.0 - ok.numel() / n if n else 0.0}
