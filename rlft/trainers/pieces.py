"""The training sequences a prefix break left behind, trained with their episode's advantage.

An agent's session becomes several sequences when a call does not extend the previous one token for token
(``rlft.gateway.session``): the batch's row holds the last, and ``Batch.pieces`` the earlier ones. They are not in
the batch while it is scored and its advantages computed (each episode is one sample of its group, once); once
advantages are known, :func:`with_pieces` appends each piece as a row of its own for the update: its sampled tokens
carry the episode's advantage (the row's mean over the tokens it sampled, the value every token of an outcome
reward's row has), the tokens the conversation added carry none, and with a critic its return is its value plus
that advantage. Its log-probs (old, reference, values) come from the same pass as the batch's (``fill``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from rlft.core.ops import masked_mean
from rlft.rollout.batch import ROW_TABLES, Batch, cat_batches, left_pad, right_pad


def piece_rows(batch: Batch) -> list[int]:
    """The batch row each piece belongs to, in order (one entry per piece)."""
    return [i for i, found in enumerate(batch.pieces) for _ in found]


def with_pieces(batch: Batch, fill: Callable[[Batch], object], pad_id: int) -> tuple[Batch, dict[str, float]]:
    """``batch`` with its pieces appended as rows (see the module's docstring), and ``gateway/pieces_trained``;
    ``batch`` itself when it has none. ``fill(sub)`` sets a sub-batch's old and reference log-probs and values
    as the batch's were set (``rlft.trainers.rl.fill_logprobs``); ``pad_id`` pads the new rows."""
    rows = piece_rows(batch)
    if not rows:
        return batch, {}
    found = [p for ps in batch.pieces for p in ps]
    prompt_ids, prompt_mask = left_pad([p["prompt"] for p in found], pad_id)
    response_ids, response_mask = right_pad([p["ids"] for p in found], pad_id)
    env_mask, _ = right_pad([p["env"] for p in found], 0)
    logp = torch.zeros(response_ids.shape)
    for k, p in enumerate(found):
        logp[k, :len(p["logp"])] = torch.tensor(p["logp"], dtype=logp.dtype)
    idx = torch.tensor(rows)
    sub = Batch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                response_mask=response_mask, truncated=torch.zeros(len(rows), dtype=torch.bool),
                group_size=batch.group_size, texts=[batch.texts[i] for i in rows],
                rollout_logp=None if batch.rollout_logp is None else logp, env_mask=env_mask,
                episodes=[batch.episodes[i] for i in rows] if batch.episodes else [], staleness=batch.staleness)
    fill(sub)
    mask = sub.action_mask.to(batch.adv.dtype)
    advantage = torch.stack([masked_mean(batch.adv[i], batch.action_mask[i]) if batch.action_mask[i].any()
                             else batch.adv.new_zeros(()) for i in rows])  # (n,) the episode's, per piece
    sub.adv = advantage[:, None] * mask
    sub.loss_mask = sub.action_mask
    if batch.ret is not None:
        sub.ret = (sub.values + sub.adv) * mask if sub.values is not None else sub.adv.clone()
    for f in dataclasses.fields(Batch):  # the rest of what the batch has: the episode's row, or no token's
        have, need = getattr(batch, f.name), getattr(sub, f.name)
        if isinstance(have, torch.Tensor) and need is None:
            if have.dim() == 1 or f.name in ROW_TABLES:
                setattr(sub, f.name, have[idx])
            else:
                setattr(sub, f.name, torch.full(sub.response_ids.shape, -1 if f.name == "roles" else 0,
                                                dtype=have.dtype))
    out = cat_batches([batch, sub])
    out.pieces = []
    return out, {"gateway/pieces_trained": float(len(rows))}
