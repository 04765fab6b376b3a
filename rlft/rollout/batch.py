"""The typed batch that flows through the RL loop.

Sequences are ``prompt (left-padded) + response (right-padded)``; in a multi-turn rollout the response holds
the policy's turns and the environment's answers in the order they were written (``env_mask`` marks the
environment's tokens: attended to, never trained on, never counted). Groups are
contiguous, so sample ``i`` belongs to prompt ``i // G`` and ``scores.view(P, G)``
is the group layout.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor


ROW_TABLES = ("role_scores", "reward_parts")  # 2-D fields with one row per sequence and no token columns


@dataclass
class Batch:
    prompt_ids: Tensor  # (B, Tp) left-padded
    prompt_mask: Tensor  # (B, Tp) 1 on real prompt tokens
    response_ids: Tensor  # (B, T) right-padded
    response_mask: Tensor  # (B, T) 1 on response tokens up to and including the first eos
    truncated: Tensor  # (B,) bool: no eos within the generation budget
    group_size: int
    texts: list[str] = field(default_factory=list)  # decoded responses, eos excluded
    scores: Tensor | None = None  # (B,) combined reward, NaN where unscorable
    adv: Tensor | None = None  # (B, T) per-token advantages
    old_logp: Tensor | None = None  # (B, T) behaviour-policy log-probs (only when several passes)
    rollout_logp: Tensor | None = None  # (B, T) log-probs the sampler computed while sampling (every backend), else None
    rollout_kept: Tensor | None = None  # (B, T, K) long: each response token's kept set under truncated sampling
    # (rlft.core.support), -1 padding; None when sampling did not truncate or rollout.replay_support is off
    ref_logp: Tensor | None = None  # (B, T) reference-model log-probs (only when a KL term needs them)
    teacher_logp: Tensor | None = None  # (B, T) the distill stage's teachers' log-prob (their weighted mean)
    values: Tensor | None = None  # (B, T) critic values at rollout time (only with a critic)
    ret: Tensor | None = None  # (B, T) critic targets (only with a critic)
    loss_mask: Tensor | None = None  # (B, T) tokens that carry a loss (response_mask minus filtered samples)
    step_rewards: Tensor | None = None  # (B, T) reward of the step ending at each token (NaN: unscorable), else 0
    step_mask: Tensor | None = None  # (B, T) 1 at the tokens where a step ends (step-level rewards)
    correct: Tensor | None = None  # (B,) bool: eval.correct_fn's verdict (reward-hacking metrics, RM refresh)
    env_mask: Tensor | None = None  # (B, T) 1 on response tokens an environment wrote (multi-turn), else None
    episodes: list[dict] = field(default_factory=list)  # multi-turn: one record per row (Trajectory.record), else []
    roles: Tensor | None = None  # (B, T) multi-agent: index of the role that wrote each response token, -1 elsewhere
    role_scores: Tensor | None = None  # (B, R) multi-agent: each role's reward, NaN where unscorable
    reward_parts: Tensor | None = None  # (B, K) each reward component unweighted (reward.fns order, then the
    # overlong penalty when on), NaN where unscorable: what GDPO normalises one by one
    pieces: list[list[dict]] = field(default_factory=list)  # per row: the training sequences a prefix break left
    # behind in its agent's session (rlft.rollout.agent), each {"prompt", "ids", "logp", "env"}; [] elsewhere
    staleness: int = 0  # policy updates between the weights that sampled the batch and those it trains (async)

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def input_ids(self) -> Tensor:  # (B, Tp + T)
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:  # (B, Tp + T)
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    @property
    def action_mask(self) -> Tensor:  # (B, T) 1 on the tokens the policy sampled: the only ones any loss reads
        if self.env_mask is None:
            return self.response_mask
        return self.response_mask * (1 - self.env_mask)

    def role_mask(self, role: int) -> Tensor:  # (B, T) 1 on the tokens role ``role`` sampled (multi-agent)
        return self.action_mask * (self.roles == role)

    @property
    def mean_rollout_logp(self) -> Tensor | None:  # (B,)
        """Per sequence, the mean of the sampler's log-probs over the tokens the policy sampled (``action_mask``)
        whose log-prob is known (not NaN): the confidence ``cor_reward`` weights votes by; NaN for a row with no
        such token; None when the batch has no ``rollout_logp``."""
        if self.rollout_logp is None:
            return None
        known = (self.action_mask != 0) & ~torch.isnan(self.rollout_logp)  # (B, T)
        total = torch.where(known, self.rollout_logp, torch.zeros_like(self.rollout_logp)).sum(1)  # (B,)
        count = known.sum(1)  # (B,)
        return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, math.nan))

    @property
    def response_lengths(self) -> Tensor:  # (B,) tokens the policy sampled (an environment's are not counted)
        return self.action_mask.sum(1)

    def index(self, idx: Tensor | slice) -> "Batch":
        """The sub-batch at ``idx`` (sequence dimension); texts follow the same selection."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                out[f.name] = v[idx]
            elif f.name in ("texts", "episodes", "pieces") and v:
                rows = range(len(self))[idx] if isinstance(idx, slice) else idx.tolist()
                out[f.name] = [v[i] for i in rows]
            else:
                out[f.name] = v
        return Batch(**out)

    def trimmed(self) -> "Batch":
        """The same rows without the padding columns none of them uses: prompt columns on the left, response
        columns on the right (position ids come from the masks, so the model computes the same function)."""
        tp = max(int(self.prompt_mask.sum(1).max()), 1) if len(self) else self.prompt_ids.shape[1]
        t = max(int(self.response_mask.sum(1).max()), 1) if len(self) else self.response_ids.shape[1]
        full_tp = self.prompt_ids.shape[1]
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor) and v.dim() >= 2 and f.name not in ROW_TABLES:
                v = v[:, full_tp - tp:] if f.name.startswith("prompt") else v[:, :t]
            out[f.name] = v
        return Batch(**out)

    def to(self, device: torch.device) -> "Batch":
        return dataclasses.replace(self, **{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                                            if isinstance(getattr(self, f.name), Tensor)})


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """(ids, mask), both (N, max_len), padded on the left."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


def right_pad(seqs: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """(ids, mask), both (N, max_len), padded on the right."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def kept_lists(kept: Tensor | None, n: int) -> list[list[int]] | None:
    """The first ``n`` kept sets of one row of ``Sampled.kept`` (T, K) as lists of ids without the -1 padding;
    None where the sampler kept none."""
    return None if kept is None else [[v for v in ids if v >= 0] for ids in kept[:n].tolist()]


def kept_tensor(rows: list[list[list[int]]], width: int) -> Tensor | None:
    """``Batch.rollout_kept`` (B, width, K) from per row, per token lists of kept ids ([] for a token without a set),
    -1 padding; None when no token has a set."""
    K = max((len(ids) for row in rows for ids in row), default=0)
    if not K:
        return None
    out = torch.full((len(rows), width, K), -1, dtype=torch.long)
    for b, row in enumerate(rows):
        for t, ids in enumerate(row):
            out[b, t, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


def cat_batches(batches: list[Batch]) -> Batch:
    """Concatenate batches along the sequence dimension, re-padding prompts (left) and responses (right).

    Optional tensors are kept only when every batch has them; all batches must share ``group_size``.
    """
    if len(batches) == 1:
        return batches[0]
    if len({b.group_size for b in batches}) != 1:
        raise ValueError("cannot concatenate batches with different group sizes")
    tp = max(b.prompt_ids.shape[1] for b in batches)
    t = max(b.response_ids.shape[1] for b in batches)
    out = {"group_size": batches[0].group_size, "texts": [x for b in batches for x in b.texts],
           "episodes": [x for b in batches for x in b.episodes] if all(b.episodes for b in batches) else [],
           "pieces": [x for b in batches for x in (b.pieces or [[]] * len(b))] if any(b.pieces for b in batches)
           else []}
    for f in dataclasses.fields(Batch):
        vals = [getattr(b, f.name) for b in batches]
        if f.name in out or not all(isinstance(v, Tensor) for v in vals):
            continue
        if vals[0].dim() == 1 or f.name in ROW_TABLES:
            out[f.name] = torch.cat(vals)
        elif f.name.startswith("prompt"):
            out[f.name] = torch.cat([torch.nn.functional.pad(v, (tp - v.shape[1], 0)) for v in vals])
        elif vals[0].dim() == 3:  # a kept set per token (rollout_kept): -1 pads both the tokens and the sets
            k = max(v.shape[2] for v in vals)
            out[f.name] = torch.cat([torch.nn.functional.pad(v, (0, k - v.shape[2], 0, t - v.shape[1]), value=-1)
                                     for v in vals])
        else:  # token columns; a role index pads with -1 (no role)
            fill = -1 if f.name == "roles" else 0
            out[f.name] = torch.cat([torch.nn.functional.pad(v, (0, t - v.shape[1]), value=fill) for v in vals])
    return Batch(**out)
