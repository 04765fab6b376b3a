"""Reward-hacking indicators: does the reward the policy optimizes still agree with a rule-checked outcome?

Pure functions of per-sample tensors; the RL loop (``rlft.trainers.hacking``)
feeds them the batch's training reward and the rule's verdicts (``eval.correct_fn``
applied to the rollouts). Conventions fixed here:

- **pair disagreement** (per step): within each group of G samples of one
  prompt, over the pairs (i, j) whose rule outcomes differ, the share that the
  reward orders wrongly: the rule-wrong sample scored above the rule-right one
  counts 1, a tie 1/2 (so a reward that cannot tell them apart scores 0.5, as a
  coin would; the complement of the ranking AUC). Pairs with an unscorable
  (NaN) reward are left out. No such pair: NaN (nothing to measure).
- **reward up, rule not** (running): a step is *flagged* when the batch mean of
  the reward rose against the previous step while the rule accuracy did not
  rise (stayed or fell). The running share is flagged steps / compared steps
  (every step but the first). With independent noise in both, about a quarter
  of the steps are flagged; a share well above that, growing, means the reward
  keeps improving on something the rule does not count.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor


def pair_disagreement(reward: Tensor, correct: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """(share of rule-discordant pairs the reward orders wrongly, ties 1/2; number of such pairs), both 0-d.

    ``reward`` (B,) float, NaN unscorable; ``correct`` (B,) bool; groups of ``group_size`` are contiguous.

    >>> pair_disagreement(torch.tensor([0.9, 0.1, 0.5, 0.5]), torch.tensor([False, True, True, False]), 2)
    (tensor(0.7500), tensor(2))
    """
    r = reward.view(-1, group_size)  # (P, G)
    c = correct.view(-1, group_size)  # (P, G)
    right_wrong = c[:, :, None] & ~c[:, None, :]  # (P, G, G) i rule-right, j rule-wrong
    scorable = ~torch.isnan(r)  # (P, G)
    pairs = right_wrong & scorable[:, :, None] & scorable[:, None, :]  # (P, G, G)
    diff = r[:, :, None] - r[:, None, :]  # (P, G, G) reward(right) - reward(wrong)
    wrong = (diff < 0).to(r.dtype) + 0.5 * (diff == 0).to(r.dtype)  # (P, G, G) NaN compares False; masked below
    n = pairs.sum()
    share = (wrong * pairs).sum() / n if n > 0 else torch.tensor(float("nan"), dtype=r.dtype)
    return share, n


@dataclass
class HackingTracker:
    """Running state of the reward-up-rule-not indicator; its ``state_dict`` goes into checkpoints."""

    prev_reward: float | None = None
    prev_rule: float | None = None
    compared: int = 0  # steps that had a previous step
    flagged: int = 0  # of those, steps whose reward mean rose while rule accuracy did not

    def update(self, reward_mean: float, rule_accuracy: float) -> bool:
        """Record one step; True when it is flagged (reward rose, rule accuracy did not)."""
        flag = False
        if self.prev_reward is not None:
            flag = reward_up_rule_not(self.prev_reward, reward_mean, self.prev_rule, rule_accuracy)
            self.compared += 1
            self.flagged += int(flag)
        self.prev_reward, self.prev_rule = reward_mean, rule_accuracy
        return flag

    @property
    def share(self) -> float:
        """Flagged / compared steps so far (0.0 before the second step)."""
        return self.flagged / self.compared if self.compared else 0.0

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)


def reward_up_rule_not(prev_reward: float, reward: float, prev_rule: float, rule: float) -> bool:
    """The reward's batch mean rose while the rule accuracy did not.

    >>> reward_up_rule_not(0.1, 0.3, 0.5, 0.5), reward_up_rule_not(0.1, 0.3, 0.5, 0.6)
    (True, False)
    """
    return reward > prev_reward and not rule > prev_rule
