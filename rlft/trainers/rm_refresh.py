"""Online reward-model refresh inside RL (``rm.refresh_every``): retrain the reward model on the policy's rollouts.

As in GRPO's original setup (Shao et al. 2024, §4.2 iterative RL: the reward
model keeps training on the policy's new samples), every ``rm.refresh_every``
policy steps the reward model trains ``rm.refresh_steps`` Bradley-Terry steps
(lr ``rm.refresh_lr``, batches of ``rm.batch_size`` pairs) on pairs built from
the rollouts since the last refresh: within each group, every distinct response
the rule (``eval.correct_fn``) judges correct over every distinct one it judges
wrong; groups with one outcome give no pair.

Ownership: the run scores with its own copy of the reward model,
``runs/<name>/reward_model/`` (copied from the reward's ``path`` when the run
starts; the reward entry's path is pointed there), and the trainer updates the
very model object that reward scores with (``RewardModel.shared``), so the next
step scores with the refreshed weights. The ``reward_model`` reward runs in the
trainer's process (it is not a pool reward), so no worker holds a stale copy.
The refreshed weights go into every checkpoint (resume continues with them) and
into ``runs/<name>/reward_model/`` when RL ends.

Metrics at a refresh step: ``rm_refresh/pairs``, ``rm_refresh/accuracy_before``
and ``rm_refresh/accuracy_after`` (ranking accuracy on the new pairs before and
after the retraining; on a seeded sample of at most 512 of them),
``rm_refresh/loss`` (their Bradley-Terry loss after), ``rm_refresh/count``.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from rlft.config import Config, ConfigError
from rlft.data.preferences import Ranking
from rlft.data.schema import Example
from rlft.rewards.terms import build

RUN_RM = "reward_model"  # the run's own copy of the reward model, under the run directory
EVAL_PAIRS = 512  # the accuracy before/after is measured on at most this many of the new pairs (a seeded sample)


def outcome_pairs(prompt, texts: Sequence[str], correct: Sequence[bool]) -> list[Ranking]:
    """Every (right, wrong) pair of one group's distinct responses, right first; [] unless both outcomes occur.

    >>> [r.responses for r in outcome_pairs("p", ["#### 7", "#### 3", "#### 7", "#### 5"], [1, 0, 1, 0])]
    [('#### 7', '#### 3'), ('#### 7', '#### 5')]
    """
    right = list(dict.fromkeys(t for t, c in zip(texts, correct) if c))
    wrong = list(dict.fromkeys(t for t, c in zip(texts, correct) if not c))
    return [Ranking(prompt, (r, w)) for r in right for w in wrong]


def reward_model_term(cfg: Config):
    """The one ``reward_model`` entry of ``reward.fns`` (the model a refresh retrains); ConfigError otherwise."""
    terms = [t for t in cfg.reward.fns if t.name == "reward_model"]
    if len(terms) != 1:
        raise ConfigError(f"rm.refresh_every: needs exactly one reward_model entry in reward.fns, found {len(terms)}")
    return terms[0]


def own_reward_model(cfg: Config, run_dir: Path) -> Config:
    """``cfg`` scoring with the run's copy of its reward model (made from the reward's path unless it exists)."""
    if not cfg.rm.refresh_every:
        return cfg
    term = reward_model_term(cfg)
    params = dict(term.params)
    from rlft.rewards.model import PIPELINE_RM, forget

    if params.get("path") == PIPELINE_RM:
        raise ConfigError(f"reward.fns: reward_model path {PIPELINE_RM!r} outside a pipeline; give a reward model")
    dest = Path(run_dir) / RUN_RM
    if not (dest / "config.json").is_file():
        shutil.copytree(params["path"], dest, dirs_exist_ok=True)
    params["path"] = str(dest)
    forget(str(dest))  # a model cached under this path in this process is not this run's
    fns = tuple(dataclasses.replace(t, params=tuple(params.items())) if t is term else t for t in cfg.reward.fns)
    return dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, fns=fns))


class RMRefresh:
    """Rollouts since the last refresh, and the reward model they retrain (shared with the reward that scores)."""

    def __init__(self, cfg: Config):
        self.reward = build(reward_model_term(cfg))
        self.model, self.tokenizer, _ = self.reward.shared()
        self.groups: list[tuple] = []  # (prompt, texts, correct) of groups with both outcomes
        self.refreshes = 0

    def record(self, examples: Sequence[Example], texts: Sequence[str], correct: Tensor | None) -> None:
        """Keep the groups of one scored batch (one example per group) whose rule outcomes differ."""
        if correct is None:
            return
        G = len(texts) // len(examples)
        for i, ex in enumerate(examples):
            c = correct[i * G:(i + 1) * G].tolist()
            if any(c) and not all(c):
                self.groups.append((ex.prompt, list(texts[i * G:(i + 1) * G]), c))

    def refresh(self, cfg: Config, seed: int) -> dict[str, float]:
        """Retrain on the pairs of the recorded groups, then forget them; the refresh metrics."""
        from rlft.trainers.rm import encode_ranking, evaluate_rm, train_rm

        r = cfg.rm
        pairs = [p for g in self.groups for p in outcome_pairs(*g)]
        self.groups = []
        self.refreshes += 1
        out = {"rm_refresh/pairs": float(len(pairs)), "rm_refresh/count": float(self.refreshes)}
        if not pairs:
            return out
        enc = [encode_ranking(p, self.tokenizer, r.max_tokens) for p in pairs]
        pad = self.tokenizer.pad_token_id
        g = torch.Generator().manual_seed(seed)
        probe = [enc[i] for i in torch.randperm(len(enc), generator=g)[:EVAL_PAIRS].tolist()]
        before = evaluate_rm(self.model, probe, pad)
        train_rm(self.model, pad, enc, dataclasses.replace(r, steps=r.refresh_steps, lr=r.refresh_lr), cfg.optim,
                 seed=seed)
        self.model.eval()
        after = evaluate_rm(self.model, probe, pad)
        return {**out, "rm_refresh/accuracy_before": before["rm/accuracy"],
                "rm_refresh/accuracy_after": after["rm/accuracy"], "rm_refresh/loss": after["rm/loss"]}

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "groups": self.groups, "refreshes": self.refreshes}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.groups, self.refreshes = [tuple(g) for g in state["groups"]], state["refreshes"]

    def save(self, path: Path) -> None:
        """The refreshed reward model and its tokenizer, loadable by the ``reward_model`` reward."""
        from rlft.runs.checkpoint import save_model

        save_model(self.model, self.tokenizer, path)
