"""A trajectory of a multi-turn rollout (the prompt, then the policy's and the environment's tokens in the order
they were written) and the batch a rollout's trajectories make: shared by the environment rollout
(``rlft.rollout.multiturn``) and the agent rollout (``rlft.rollout.agent``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlft.models.lora import core_model
from rlft.rollout.batch import Batch, kept_tensor, left_pad, right_pad


@dataclass
class Trajectory:
    """One conversation between the policy and its environment."""

    prompt: list[int]  # the prompt's tokens
    messages: list[dict]  # the chat so far, as the template renders it (prompt, then turns)
    ids: list[int] = field(default_factory=list)  # the response: policy and environment tokens, in order
    logp: list[float] = field(default_factory=list)  # the sampler's log-prob of each policy token, 0.0 elsewhere
    kept: list[list[int]] = field(default_factory=list)  # per token of ids: its kept set under truncated sampling
    # (rlft.core.support), [] for an environment's token or where the sampler kept none
    segments: list[dict] = field(default_factory=list)  # {"who": "policy" | "env", "text", "tokens"} in order
    turns: int = 0  # turns the policy wrote
    done: bool = False
    truncated: bool = False  # ended by a limit (turns, tokens), not by the policy or the environment
    reward: float | None = None  # the environment's own verdict, when it gives one
    error: str | None = None  # why the environment cost this trajectory, else None
    tools: Counter = field(default_factory=Counter)  # calls per tool name
    tool_errors: int = 0
    malformed: int = 0  # calls that named no tool it has, or could not be read
    turn_rewards: list[tuple[int, float]] = field(default_factory=list)  # (index in ids of a turn's end, reward)
    open_turn: list[int] = field(default_factory=list)  # tokens of the assistant message still being written
    role: list[int] = field(default_factory=list)  # per token of ids: the index of the role that wrote it, -1: env
    next_role: int = 0  # the role that writes the next turn (multi-agent; always 0 with one policy)
    role_rewards: dict[str, float] = field(default_factory=dict)  # each role's verdict from the environment

    def record(self, tokenizer) -> dict:
        """What samples, metrics, rewards and reports keep of this trajectory (plain data); ``turn_rewards`` as
        ``(end_char, reward)`` in ``text(tokenizer)``."""
        ends = [(len(tokenizer.decode(self.ids[:k + 1], skip_special_tokens=True)), r) for k, r in self.turn_rewards]
        return {"turns": self.turns, "truncated": self.truncated, "error": self.error, "env_reward": self.reward,
                "turn_rewards": ends, "tools": dict(self.tools), "tool_errors": self.tool_errors,
                "malformed_calls": self.malformed, "segments": list(self.segments),
                "role_rewards": dict(self.role_rewards)}

    def text(self, tokenizer) -> str:
        """What the rewards score: the whole response as written (the policy's turns and the environment's
        tokens, chat-template markup included), decoded as a single-turn completion is."""
        return tokenizer.decode(self.ids, skip_special_tokens=True)

    @property
    def env(self) -> list[int]:  # 1 where the environment wrote ids[k] (its role is -1)
        return [int(r < 0) for r in self.role]

    def role_text(self, role: str) -> str:
        """Role ``role``'s answer: its last turn (``role_text``)."""
        return role_text(self.segments, role)

    def add(self, ids: list[int], who: str, text: str, logp: list[float] | None = None, role: int = -1,
            role_name: str | None = None, kept: list[list[int]] | None = None) -> None:
        """Append a segment: ``ids`` the policy sampled (``who="policy"``, with their ``logp``, ``role`` and
        ``kept`` sets) or the environment wrote (``who="env"``; no ids: shown in samples and reports, never trained
        on)."""
        policy = who == "policy"
        self.ids += ids
        self.logp += logp if policy else [0.0] * len(ids)
        self.kept += kept if policy and kept is not None else [[] for _ in ids]
        self.role += [role if policy else -1] * len(ids)
        segment = {"who": who, "text": text, "tokens": len(ids)}
        if role_name is not None:
            segment["role"] = role_name
        self.segments.append(segment)


def role_text(segments: Sequence[Mapping[str, Any]], role: str) -> str:
    """Role ``role``'s answer in a trajectory's ``segments``: the last turn it wrote ("" when none). In a
    multi-agent episode a role's earlier turns are drafts the other roles answered; its last is what it stands by,
    and what the run's reward functions and the held-out rule read.

    >>> role_text([{"who": "policy", "role": "a", "text": "#### 1"}, {"who": "env", "text": "?"},
    ...            {"who": "policy", "role": "b", "text": "no"}, {"who": "policy", "role": "a", "text": "#### 2"}], "a")
    '#### 2'
    """
    return next((s["text"] for s in reversed(segments) if s["who"] == "policy" and s.get("role") == role), "")


def model_positions(model) -> int:
    """The longest sequence the model takes (its ``max_position_embeddings``), else a bound no rollout reaches."""
    n = getattr(getattr(core_model(model), "config", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else 1 << 30


def trajectories_batch(trajs: list[Trajectory], tokenizer, G: int, exact: bool, roles: Sequence[str] = ()) -> Batch:
    """The trajectories as a Batch: prompts left-padded, responses right-padded, ``env_mask`` on the environment's
    tokens; ``rollout_logp`` only when the sampler gave every policy token's log-prob. With ``roles``: ``roles``
    (the role index of every policy token, -1 elsewhere) and ``texts`` of the first role's last turn, which the
    run's reward functions and the held-out rule read."""
    pad_id = tokenizer.pad_token_id
    prompt_ids, prompt_mask = left_pad([t.prompt for t in trajs], pad_id)
    response_ids, response_mask = right_pad([t.ids or [pad_id] for t in trajs], pad_id)
    for k, t in enumerate(trajs):
        if not t.ids:
            response_mask[k] = 0
    env_mask, _ = right_pad([t.env or [0] for t in trajs], 0)
    logp = torch.zeros(response_ids.shape)
    for k, t in enumerate(trajs):
        logp[k, :len(t.logp)] = torch.tensor(t.logp, dtype=logp.dtype)
    role_ids = right_pad([t.role or [-1] for t in trajs], -1)[0] if roles else None
    kept = kept_tensor([t.kept for t in trajs], response_ids.shape[1])  # an environment's tokens have none
    texts = [t.role_text(roles[0]) if roles else t.text(tokenizer) for t in trajs]
    return Batch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                 response_mask=response_mask, truncated=torch.tensor([t.truncated for t in trajs]), group_size=G,
                 texts=texts, rollout_logp=logp if exact else None, rollout_kept=kept, env_mask=env_mask,
                 episodes=[t.record(tokenizer) for t in trajs], roles=role_ids)
