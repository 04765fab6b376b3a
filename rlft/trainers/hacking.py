"""The rule's verdict on each rollout, and the reward-hacking metrics the RL loop logs from it.

The rule is ``eval.correct_fn`` (the function the held-out evaluation counts
correct answers with; a value >= 1 is correct), applied to every rollout next to
the training reward. Metrics, per RL step, over every sample the step drew
(math in ``rlft.core.reward_hacking``):

- ``reward_hacking/rule_accuracy``: share of the rollouts the rule judges correct;
- ``reward_hacking/pair_disagreement``: within each group, over the pairs whose
  rule outcomes differ, the share the training reward orders wrongly (ties 1/2;
  not logged when no group has both outcomes); ``.../discordant_pairs``: how many;
- ``reward_hacking/reward_up_rule_not``: running share of the steps so far at
  which the training reward's batch mean (``reward/mean``) rose against the
  previous step while the rule accuracy did not; ``.../reward_up_rule_not_step``
  is this step's flag (1 or 0).

With a learned reward (``reward_model``) these say how often the policy pleases
the reward model without being right; with rule-based rewards they measure the
gap between the reward and the evaluation's rule. When the rule can score no
rollout (a task without ground truths) nothing is logged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rlft.config import Config
from rlft.core.reward_hacking import HackingTracker, pair_disagreement
from rlft.data.schema import Example
from rlft.rewards import score_batch
from rlft.rewards.scoring import ScoreResult

PREFIX = "reward_hacking/"


def rule_correct(texts: Sequence[str], examples: Sequence[Example], group_size: int, cfg: Config,
                 scored: ScoreResult | None = None) -> Tensor | None:
    """(B,) bool: ``eval.correct_fn`` >= 1 on each response (examples one per group); None when it scores none.

    When the training reward already holds ``eval.correct_fn`` with its default parameters (the embedded demo's
    ``final_answer``), its values in ``scored`` are reused instead of scoring every rollout a second time.
    """
    name = cfg.eval.correct_fn
    same = [t for t in cfg.reward.fns if t.key == name and t.name == name and not t.params]
    if scored is not None and same and name in scored.per_fn:
        values = scored.per_fn[name]
    else:
        samples = [ex.to_mapping() for ex in examples for _ in range(group_size)]
        values = score_batch(list(texts), samples, [name], [1.0], timeout_s=cfg.reward.timeout_s).total
    if all(v is None for v in values):
        return None
    return torch.tensor([v is not None and v >= 1.0 for v in values])  # (B,)


def batch_metrics(scores: Sequence[Tensor], correct: Sequence[Tensor | None], group_size: int) -> dict[str, float]:
    """Rule accuracy and pair disagreement over the step's drawn batches (scores (B,), correct (B,) each)."""
    if not correct or any(c is None for c in correct):
        return {}
    s, c = torch.cat(list(scores)), torch.cat(list(correct))  # (N,) each
    share, n = pair_disagreement(s, c, group_size)
    out = {PREFIX + "rule_accuracy": c.float().mean().item(), PREFIX + "discordant_pairs": float(n)}
    if n > 0:  # no group with both outcomes: nothing to disagree on, and no NaN in the log
        out[PREFIX + "pair_disagreement"] = share.item()
    return out


def tracker_metrics(tracker: HackingTracker, metrics: dict[str, float]) -> dict[str, float]:
    """Update the running indicator with this step's ``reward/mean`` and rule accuracy; {} without a rule."""
    if PREFIX + "rule_accuracy" not in metrics:
        return {}
    flag = tracker.update(metrics["reward/mean"], metrics[PREFIX + "rule_accuracy"])
    return {PREFIX + "reward_up_rule_not": tracker.share, PREFIX + "reward_up_rule_not_step": float(flag)}
