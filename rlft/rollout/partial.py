"""Partial rollouts (Kimi k1.5, arXiv:2501.12599, §2.6.2): responses sampled a token budget at a time, across steps.

With ``rollout.partial_tokens = L`` each RL step samples at most L new tokens for every unfinished response of the
groups in flight: first the groups carried over from earlier steps, then fresh prompts up to P groups. A response
is finished when it ends with a stop token or reaches ``rollout.max_new_tokens``; a group is finished when all its
G responses are. Finished groups are trained on this step; the others keep their tokens and the sampler's log-prob
of each token and continue in the next step, from where they stopped, with the weights of that step. So a long
response no longer holds the whole batch back: the step's sampling is bounded by L tokens per response (the step
samples further segments only while no group at all has finished).

The tokens of a response carried over were sampled by older weights: the batch is stale (``Batch.staleness``, the
steps between the oldest token's sampling and this step), its old log-probs are recomputed by the trainer, and
``algo.rollout_correction=auto`` corrects the ratio with the sampler's log-probs (``rlft.core.rollout_corr``), as
for one-step-off rollouts. The groups in flight are part of the checkpoint (``PartialRollouts.state_dict``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from rlft.rollout.batch import Batch, kept_lists, kept_tensor, left_pad, right_pad
from rlft.rollout.decode import Sampled


@dataclass
class Pending:
    """One group in flight: the prompt's index and its G responses so far."""

    index: int  # the prompt's position in the training data
    started: int  # the RL step whose weights sampled its first tokens
    tokens: list[list[int]] = field(default_factory=list)  # G responses so far (a finished one ends at its stop token)
    logps: list[list[float]] = field(default_factory=list)  # the sampler's log-prob of each of those tokens
    done: list[bool] = field(default_factory=list)  # ended by a stop token or at rollout.max_new_tokens
    ended: list[bool] = field(default_factory=list)  # ended by a stop token (a done response that did not: truncated)
    carried: list[int] = field(default_factory=list)  # tokens sampled in earlier steps, at the start of this one
    kept: list[list[list[int]]] = field(default_factory=list)  # per response, per token: its kept set under
    # truncated sampling (rlft.core.support), [] where the sampler kept none

    @property
    def finished(self) -> bool:
        return all(self.done)


class PartialRollouts:
    """The groups in flight between steps and the segment-by-segment sampling of ``rollout.partial_tokens``."""

    def __init__(self, budget: int, max_new_tokens: int, group_size: int):
        if budget < 1 or max_new_tokens < 1:
            raise ValueError(f"partial rollouts need a budget and max_new_tokens >= 1, got {budget}, {max_new_tokens}")
        self.budget, self.max_new_tokens, self.group_size = budget, max_new_tokens, group_size
        self.pending: list[Pending] = []

    def state_dict(self) -> dict:
        return {"pending": [dataclasses.asdict(p) for p in self.pending], "group_size": self.group_size}

    def load_state_dict(self, state: dict) -> None:
        if state["group_size"] != self.group_size:
            raise ValueError(f"the checkpoint's partial rollouts hold groups of {state['group_size']}, this run "
                             f"samples groups of algo.group_size={self.group_size}")
        self.pending = [Pending(**p) for p in state["pending"]]

    def collect(self, run: Callable[[list[list[int]], int, int], Sampled], prompts: Sequence[list[int]],
                take: Callable[[int], list[int]], n_groups: int, step: int) -> list[Pending]:
        """The groups that finished this step, in the order they entered; the unfinished stay in flight.

        ``run(contexts, group_size, max_new_tokens)`` samples (``rlft.rollout.hf.turn_sampler``); ``prompts`` are
        the training prompts' token ids; ``take(k)`` draws k fresh prompt indices; ``n_groups`` (P) is the number of
        groups in flight after the fresh ones join; ``step`` is the RL step about to train."""
        for g in self.pending:
            g.carried = [len(t) for t in g.tokens]
        k = n_groups - len(self.pending)
        fresh = [Pending(i, step, [[] for _ in range(self.group_size)], [[] for _ in range(self.group_size)],
                         [False] * self.group_size, [False] * self.group_size, [0] * self.group_size,
                         [[] for _ in range(self.group_size)])
                 for i in (take(k) if k > 0 else [])]
        groups = self.pending + fresh
        while True:
            self._segment(run, prompts, groups)
            if any(g.finished for g in groups):
                break
        self.pending = [g for g in groups if not g.finished]
        return [g for g in groups if g.finished]

    def _segment(self, run, prompts: Sequence[list[int]], groups: list[Pending]) -> None:
        """At most ``budget`` more tokens for every unfinished response: the untouched groups' G responses from their
        prompt (one shared prefill per group), every other unfinished response from its prompt + its tokens so far."""
        new = [g for g in groups if not any(g.tokens)]
        rows = [(g, j) for g in groups if any(g.tokens) for j in range(self.group_size) if not g.done[j]]
        if new:
            s = run([prompts[g.index] for g in new], self.group_size, min(self.budget, self.max_new_tokens))
            for k, (g, j) in enumerate((g, j) for g in new for j in range(self.group_size)):
                self._extend(g, j, s, k)
        if rows:
            room = max(self.max_new_tokens - len(g.tokens[j]) for g, j in rows)
            s = run([prompts[g.index] + g.tokens[j] for g, j in rows], 1, min(self.budget, room))
            for k, (g, j) in enumerate(rows):
                self._extend(g, j, s, k)

    def _extend(self, g: Pending, j: int, s: Sampled, row: int) -> None:
        """Append row ``row`` of ``s`` to response j of group ``g``, cut at rollout.max_new_tokens."""
        n = int(s.response_mask[row].sum())
        room = self.max_new_tokens - len(g.tokens[j])
        keep = min(n, room)
        if len(g.kept) < len(g.tokens):  # a group from a checkpoint written before kept sets were kept
            g.kept += [[] for _ in range(len(g.tokens) - len(g.kept))]
        g.kept[j] += [[] for _ in range(len(g.tokens[j]) - len(g.kept[j]))]
        g.kept[j] += kept_lists(None if s.kept is None else s.kept[row], keep) or [[] for _ in range(keep)]
        g.tokens[j] += s.response_ids[row, :keep].tolist()
        g.logps[j] += s.logprobs[row, :keep].tolist()
        g.ended[j] = keep == n and not bool(s.truncated[row])  # its stop token is in (never cut off)
        g.done[j] = g.ended[j] or len(g.tokens[j]) >= self.max_new_tokens


def finished_batch(groups: Sequence[Pending], prompts: Sequence[list[int]], tokenizer, step: int) -> Batch:
    """The finished ``groups`` as a training batch (rows ``[i*G, (i+1)*G)`` = group i), with each token's sampler
    log-prob in ``rollout_logp`` and ``staleness`` = the steps since the oldest group's first tokens."""
    rows = [(g, j) for g in groups for j in range(len(g.tokens))]
    pad = tokenizer.pad_token_id
    prompt_ids, prompt_mask = left_pad([list(prompts[g.index]) for g, _ in rows], pad)
    response_ids, response_mask = right_pad([g.tokens[j] for g, j in rows], pad)
    logp = torch.zeros(response_ids.shape)  # (B, T)
    for r, (g, j) in enumerate(rows):
        logp[r, :len(g.logps[j])] = torch.tensor(g.logps[j], dtype=torch.float32)
    kept = kept_tensor([g.kept[j] if j < len(g.kept) else [] for g, j in rows], response_ids.shape[1])
    ended = torch.tensor([g.ended[j] for g, j in rows])
    stop = torch.zeros_like(response_mask, dtype=torch.bool)  # each ended row's stop token, as generate hides it
    lengths = response_mask.sum(1)
    stop[ended.nonzero().squeeze(1), lengths[ended] - 1] = True
    shown = response_ids.masked_fill(stop | (response_mask == 0), pad)
    return Batch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                 response_mask=response_mask, truncated=~ended, group_size=len(groups[0].tokens),
                 texts=tokenizer.batch_decode(shown, skip_special_tokens=True), rollout_logp=logp, rollout_kept=kept,
                 staleness=max(step - g.started for g in groups))


def partial_metrics(finished: Sequence[Pending], in_flight: int, step: int) -> dict[str, float]:
    """``partial/finished_groups``, ``partial/pending_groups`` (in flight after this step),
    ``partial/carried_token_frac`` (share of the trained tokens sampled in an earlier step, by older weights) and
    ``partial/max_staleness``."""
    total = sum(len(t) for g in finished for t in g.tokens)
    carried = sum(c for g in finished for c in g.carried)
    return {"partial/finished_groups": float(len(finished)), "partial/pending_groups": float(in_flight),
            "partial/carried_token_frac": carried / max(total, 1),
            "partial/max_staleness": float(max((step - g.started for g in finished), default=0))}
