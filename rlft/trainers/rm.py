"""Bradley-Terry reward models: a scalar head on a causal-LM backbone, trained on rankings of responses.

The model is ``AutoModelForSequenceClassification`` with one label, built from
a causal-LM directory (the backbone's weights, a new linear ``score`` head), so
the saved checkpoint loads anywhere Hugging Face models load, and in rlft's
``reward_model`` reward.

- **Pooling** (``last`` or ``mean``, ``rlft.models.reward_head``): stored in
  the checkpoint's config, applied the same way when the ``reward_model``
  reward scores. Texts are rendered exactly as that reward renders them
  (``rlft.rewards.model.encode``: the chat template with the response as the
  assistant turn, or prompt + response), so training and scoring agree.
- **Loss** (InstructGPT eq. 1): each prompt's K responses are scored once and
  all C(K, 2) pairs are one batch element: the prompt's loss is the mean of
  ``-log sigma(r_better - r_worse - margin)`` over its pairs, plus the optional
  centring term ``center_coef * (r_better + r_worse)^2``; the batch loss is the
  mean over prompts.
- **Metrics**: ``rm/loss``, ``rm/accuracy`` (share of pairs ranked right),
  ``rm/margin`` (mean r_better - r_worse), ``rm/reward_mean``, ``rm/reward_std``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from rlft.config import OptimConfig, RMConfig

from rlft.core.preference import bradley_terry_loss, ranking_pairs, reward_centering
from rlft.data.preferences import Ranking
from rlft.models.reward_head import pad_batch, pooled_scores
from rlft.rewards.model import encode
from rlft.trainers.resumable import Checkpoints


def encode_ranking(ranking: Ranking, tokenizer, max_tokens: int) -> list[list[int]]:
    """Token ids of each response of ``ranking`` (best first) with its prompt, as the reward renders them."""
    return [encode(tokenizer, ranking.prompt, response, max_tokens, "left") for response in ranking.responses]


def rm_scores(model, seqs: Sequence[list[int]], pad_id: int) -> Tensor:
    """One score per sequence (N,), right-padded into one forward pass."""
    return pooled_scores(model, *pad_batch(list(seqs), pad_id, "right"))  # (N,)


def ranking_loss(scores: Tensor, sizes: Sequence[int], margin: float = 0.0,
                 center_coef: float = 0.0) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean over prompts of the mean pair loss of each prompt; ``scores`` (N,) holds each ranking's K, best first."""
    losses, diffs, start = [], [], 0
    for k in sizes:
        s = scores[start:start + k]  # (K,) this prompt's responses, best first
        w, l_ = (torch.tensor(ix, device=scores.device) for ix in zip(*ranking_pairs(k)))  # (C,) each
        pair = bradley_terry_loss(s[w], s[l_], margin) + reward_centering(s[w], s[l_], center_coef)  # (C,)
        losses.append(pair.mean())  # one batch element per prompt (InstructGPT: 1 / C(K,2) of its pairs)
        diffs.append(s[w] - s[l_])
        start += k
    diff = torch.cat(diffs)  # (sum C,)
    metrics = {"rm/accuracy": (diff > 0).float().mean(), "rm/margin": diff.mean(),
               "rm/reward_mean": scores.mean(), "rm/reward_std": scores.std() if len(scores) > 1 else scores.new_zeros(())}
    return torch.stack(losses).mean(), metrics


@torch.no_grad()
def evaluate_rm(model, encoded: Sequence[list[list[int]]], pad_id: int, batch_size: int = 16) -> dict[str, float]:
    """Held-out ranking metrics: ``rm/accuracy`` over all pairs, ``rm/margin``, reward mean/std, ``rm/loss``."""
    was_training = model.training
    model.eval()
    scores, sizes = [], []
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start:start + batch_size]
        scores.append(rm_scores(model, [s for r in chunk for s in r], pad_id))
        sizes.extend(len(r) for r in chunk)
    loss, m = ranking_loss(torch.cat(scores), sizes)
    model.train(was_training)
    return {"rm/loss": loss.item(), **{k: v.item() for k, v in m.items()}}


def train_rm(model, pad_id: int, train: Sequence[list[list[int]]], rm: RMConfig, optim: OptimConfig = OptimConfig(),
             seed: int = 0, on_step: Callable[[int, dict], None] = lambda step, m: None, *,
             checkpoints: Checkpoints | None = None, resume: Path | None = None) -> None:
    """``rm.steps`` AdamW steps on random batches of encoded rankings (each a list of K sequences).
    ``checkpoints``: made by :func:`rm_checkpoints` (every ``train.save_every`` steps and on a stop signal);
    ``resume``: one of them, whose weights ``model`` already has, to continue from."""
    opt, sched = rm_optimizer(model, rm, optim)
    gen = torch.Generator().manual_seed(seed)
    start = checkpoints.attach(opt, sched, gen, resume) if checkpoints is not None else 0
    model.train()
    for step in range(start, rm.steps):
        idx = torch.randint(len(train), (min(rm.batch_size, len(train)),), generator=gen).tolist()
        chunk = [train[i] for i in idx]
        scores = rm_scores(model, [s for r in chunk for s in r], pad_id)  # (N,)
        loss, m = ranking_loss(scores, [len(r) for r in chunk], rm.margin, rm.center_coef)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip or float("inf"))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        on_step(step, {"rm/loss": loss.item(), "rm/grad_norm": grad_norm.item(), "rm/lr": sched.get_last_lr()[0],
                       **{f"{k}_train": v.item() for k, v in m.items()}})
        if checkpoints is not None:
            checkpoints.after(step + 1, {"generator": gen.get_state()})


def rm_optimizer(model, rm: RMConfig, optim: OptimConfig):
    """AdamW on the model and its schedule: ``rm.schedule`` over ``rm.steps`` after ``rm.warmup_steps`` (-1: the
    first tenth, at most 10 steps)."""
    from rlft.trainers.optim import make_optimizer, make_scheduler

    opt = make_optimizer(model.parameters(), lr=rm.lr, weight_decay=optim.weight_decay,
                         betas=(optim.beta1, optim.beta2), eps=optim.eps)
    warmup = min(10, rm.steps // 10) if rm.warmup_steps < 0 else rm.warmup_steps
    return opt, make_scheduler(opt, warmup=warmup, total=rm.steps, schedule=rm.schedule)
