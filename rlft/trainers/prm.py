"""Process reward models: a per-token head (``rlft.models.prm_head``) trained with binary cross-entropy on step labels.

- **Data** (:func:`step_examples`): for each problem of the task, its reference
  solution, or with probability ``perturb`` a copy in which one to two lines
  have their last number changed by 1 to 3 (a wrong intermediate result or
  final answer); every line is a step, labelled by a step-level rule reward
  (``prm.labels``, default ``chain_steps``: 1 right, 0 wrong; values are used
  as BCE targets, so they must lie in [0, 1]).
- **Loss**: mean over the batch's steps of BCE(logit at the step's last token, label).
- **Metrics**: ``prm/loss``, ``prm/accuracy`` (share of steps whose logit sign
  matches the label rounded), ``prm/positive_rate`` (share of right steps).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlft.data.schema import Example
from rlft.models.prm_head import encode_steps, line_steps, step_logits
from rlft.runs import stop

_LAST_INT = re.compile(r"-?\d+(?=\D*$)")


@dataclass(frozen=True)
class StepExample:
    ids: list[int]  # prompt + completion token ids
    positions: list[int]  # index in ids of each step's last token
    labels: list[float]  # target per step, in [0, 1]


def perturbed(solution: str, rng: random.Random) -> str:
    """``solution`` with the last number of one or two of its lines moved by 1 to 3."""
    lines = solution.split("\n")
    for i in rng.sample(range(len(lines)), k=min(len(lines), rng.choice((1, 2)))):
        m = _LAST_INT.search(lines[i])
        if m is not None:
            value = int(m.group(0)) + rng.choice((-3, -2, -1, 1, 2, 3))
            lines[i] = lines[i][:m.start()] + str(value) + lines[i][m.end():]
    return "\n".join(lines)


def step_examples(examples: Sequence[Example], tok, label_fn: Callable, perturb: float, max_tokens: int,
                  seed: int) -> list[StepExample]:
    """One labelled solution per example (reference or perturbed), encoded for the PRM."""
    rng = random.Random(seed)
    out = []
    for ex in examples:
        text = perturbed(ex.response, rng) if rng.random() < perturb else ex.response
        ends = line_steps(text)
        rewards = dict(label_fn(text, ex.to_mapping()))
        labels = [float(rewards.get(e, 0.0)) for e in ends]
        if any(not 0.0 <= y <= 1.0 for y in labels):
            raise ValueError(f"prm.labels: step rewards must lie in [0, 1] to be BCE targets, got {labels}")
        ids, positions = encode_steps(tok, ex.prompt, text, ends, max_tokens)
        out.append(StepExample(ids, positions, labels))
    return out


def prm_loss(model, batch: Sequence[StepExample], pad_id: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean BCE over the batch's steps, and its metrics."""
    logits = torch.cat(step_logits(model, [x.ids for x in batch], [x.positions for x in batch], pad_id))  # (S,)
    labels = torch.tensor([y for x in batch for y in x.labels], device=logits.device)  # (S,)
    loss = F.binary_cross_entropy_with_logits(logits, labels)  # Lightman et al. 2023 §2.4: per-step classification
    right = ((logits > 0) == (labels >= 0.5)).float()
    return loss, {"prm/accuracy": right.mean(), "prm/positive_rate": (labels >= 0.5).float().mean()}


@torch.no_grad()
def evaluate_prm(model, data: Sequence[StepExample], pad_id: int, batch_size: int = 32) -> dict[str, float]:
    """Held-out ``prm/loss``, ``prm/accuracy``, ``prm/positive_rate`` over all steps (step-weighted)."""
    was_training = model.training
    model.eval()
    sums, n = {"prm/loss": 0.0, "prm/accuracy": 0.0, "prm/positive_rate": 0.0}, 0
    for start in range(0, len(data), batch_size):
        chunk = data[start:start + batch_size]
        k = sum(len(x.labels) for x in chunk)
        loss, m = prm_loss(model, chunk, pad_id)
        for key, v in {"prm/loss": loss, **m}.items():
            sums[key] += v.item() * k
        n += k
    model.train(was_training)
    return {key: v / max(n, 1) for key, v in sums.items()}


def train_prm(model, pad_id: int, train: Sequence[StepExample], steps: int, batch_size: int, lr: float,
              weight_decay: float = 0.0, grad_clip: float = 1.0, seed: int = 0,
              on_step: Callable[[int, dict], None] = lambda step, m: None) -> None:
    """``steps`` AdamW steps on random batches of labelled solutions."""
    from rlft.trainers.optim import make_optimizer, make_scheduler

    opt = make_optimizer(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = make_scheduler(opt, warmup=min(10, steps // 10), total=steps, schedule="cosine")
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for step in range(steps):
        stop.check(f"PRM training, before step {step + 1} (the prm stage writes no checkpoint)")
        idx = torch.randint(len(train), (min(batch_size, len(train)),), generator=gen).tolist()
        loss, m = prm_loss(model, [train[i] for i in idx], pad_id)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or float("inf"))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        on_step(step, {"prm/loss": loss.item(), "prm/grad_norm": grad_norm.item(), "prm/lr": sched.get_last_lr()[0],
                       **{f"{k}_train": v.item() for k, v in m.items()}})
