"""Several agents on one base in the RL loop (``roles``): each role's reward, its advantage over its own tokens,
and its metrics. The model side (one LoRA adapter per role, the forward under a role) is rlft.models.roles; the
episodes that alternate the roles are rlft.rollout.multiturn's."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from rlft.config import Config
from rlft.core.advantages import AdvantageInputs
from rlft.rewards import score_batch
from rlft.rewards.terms import built
from rlft.rollout.batch import Batch
from rlft.rollout.multiturn import role_text


def score_roles(batch: Batch, lead: Tensor, samples: Sequence[Mapping[str, Any]], cfg: Config,
                step: int = 1) -> Tensor:
    """(B, R) each role's reward: ``roles.rewards`` says whether it is the run's reward functions on the role's last
    turn (``task``; the first role's are ``lead``, the batch's texts being its last turns) or the environment's
    verdict for it (``env``); NaN where there is none, and on every role of a trajectory the environment cost. The
    reward functions weigh as at RL step ``step``."""
    names, out = cfg.roles.names, []
    lost = [e["error"] is not None for e in batch.episodes]
    for k, (name, source) in enumerate(zip(names, cfg.roles.sources)):
        if source == "env":
            col = [e["role_rewards"].get(name, math.nan) for e in batch.episodes]
        elif k == 0:
            col = lead.tolist()
        else:
            texts = [role_text(e["segments"], name) for e in batch.episodes]
            scored = score_batch(texts, samples, built(cfg.reward), cfg.reward.weights_at(step),
                                 timeout_s=cfg.reward.timeout_s, group_size=batch.group_size)
            col = [math.nan if s is None else s for s in scored.total]
        out.append([math.nan if bad else float(v) for v, bad in zip(col, lost)])
    for e, row in zip(batch.episodes, zip(*out)):  # kept with the episode in samples.jsonl
        e["role_scores"] = {name: None if math.isnan(v) else v for name, v in zip(names, row)}
    return torch.tensor(out, dtype=torch.float32).T.contiguous()  # (B, R)


def role_advantages(estimate: Callable[[AdvantageInputs], tuple[Tensor, Tensor]], inp: AdvantageInputs,
                    batch: Batch) -> tuple[Tensor, Tensor]:
    """(adv, ret), each (B, T): the estimator run once per role on that role's reward and tokens only (its group
    baseline from its own rewards, its returns over its own turns: other roles' tokens are skipped as an
    environment's are), each token then carrying its own role's values."""
    adv, ret = torch.zeros(inp.mask.shape), torch.zeros(inp.mask.shape)
    for k in range(batch.role_scores.shape[1]):
        mask = batch.role_mask(k).to(inp.mask.dtype)  # (B, T)
        a_k, r_k = estimate(dataclasses.replace(inp, scores=batch.role_scores[:, k], mask=mask))
        adv, ret = adv + a_k * mask, ret + r_k * mask
    return adv, ret


def role_metrics(batches: Sequence[Batch], names: Sequence[str]) -> dict[str, float]:
    """``role/<name>/reward/mean`` (over the scored episodes), ``role/<name>/turns/mean`` and
    ``role/<name>/tokens/mean`` (per episode) of every role."""
    batches = [b for b in batches if b.role_scores is not None]
    if not batches:
        return {}
    scores = torch.cat([b.role_scores for b in batches])  # (B, R)
    episodes = [e for b in batches for e in b.episodes]
    out: dict[str, float] = {}
    for k, name in enumerate(names):
        col = scores[:, k]
        col = col[~torch.isnan(col)]
        tokens = torch.cat([b.role_mask(k).sum(1) for b in batches]).float()
        turns = [sum(s["who"] == "policy" and s.get("role") == name for s in e["segments"]) for e in episodes]
        out[f"role/{name}/reward/mean"] = col.mean().item() if col.numel() else 0.0
        out[f"role/{name}/turns/mean"] = sum(turns) / max(len(turns), 1)
        out[f"role/{name}/tokens/mean"] = tokens.mean().item()
    return out
