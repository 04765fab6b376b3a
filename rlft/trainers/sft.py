"""Supervised fine-tuning: token-mean NLL on reference completions, with one of three loss masks.

``sft.loss_on``: ``all`` (prompt and completion), ``response`` (the completion
and its eos) or ``answer`` (the final answer and the eos only; see
``rlft.data.sft_data``). Metrics per step: ``sft/loss``,
``sft/mean_token_accuracy`` (share of loss tokens the model predicts as its
argmax), ``sft/num_tokens`` (loss tokens trained on so far), ``sft/samples_per_s``,
``sft/grad_norm``, ``sft/lr``.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from rlft.config import Config
from rlft.core.losses import sft_loss
from rlft.core.ops import logprobs_from_logits, masked_mean
from rlft.data.schema import DataError, Example
from rlft.data.sft_data import load_sft_examples, response_weights, with_system_prompt
from rlft.data.templates import encode_prompts
from rlft.models.forward import response_logits
from rlft.rollout.batch import left_pad, right_pad
from rlft.trainers.optim import make_optimizer, make_scheduler

Item = tuple[list[int], list[int], list[int]]  # prompt ids, target ids, loss weight (0/1) per target id


def sft_examples(cfg: Config, rl_examples: Sequence[Example]) -> list[Example]:
    """What SFT trains on: ``sft.source``'s rows, else the RL rows (their reference responses), with the system prompt."""
    s = cfg.sft
    if s.source:
        return load_sft_examples(s.source, s.train_split, s.system_prompt)
    return with_system_prompt(list(rl_examples), s.system_prompt)


def sft_pairs(examples: Sequence[Example], tokenizer, cfg: Config) -> list[Item]:
    """(prompt ids, target ids, loss weights) for every example, as ``sft.loss_on`` says."""
    missing = [i for i, ex in enumerate(examples) if not ex.response]
    if missing:
        raise DataError(f"sft: {len(missing)} training rows have no reference response (first: row {missing[0]}); "
                        "set data.response_key, sft.source, or sft.steps=0")
    prompts = encode_prompts(examples, cfg.data.template, tokenizer, cfg.data.max_prompt_tokens, "sft data")
    loss_on = cfg.sft.loss_on
    items = []
    for i, (p, ex) in enumerate(zip(prompts, examples)):
        try:
            r, w = response_weights(ex.response, tokenizer, loss_on)
        except ValueError as e:
            raise DataError(f"sft data, row {i}: sft.loss_on=answer: {e}") from None
        items.append((p[:1], p[1:] + r, [1] * (len(p) - 1) + w) if loss_on == "all" else (p, r, w))
    return items


def sft_step_loss(model, batch: Sequence[Item], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token-mean NLL over weighted tokens, argmax-accuracy over them, their count) of one batch."""
    p_ids, p_mask = left_pad([x[0] for x in batch], pad_id)
    r_ids, r_mask = right_pad([x[1] for x in batch], pad_id)
    weights, _ = right_pad([x[2] for x in batch], 0)  # (B, T) 0/1, 0 on padding
    logits = response_logits(model, p_ids, p_mask, r_ids, r_mask)  # (B, T, V)
    labels = r_ids.to(logits.device)
    mask = weights.to(logits.device).float()  # (B, T)
    loss = sft_loss(logprobs_from_logits(logits, labels), mask)
    accuracy = masked_mean((logits.detach().argmax(-1) == labels).float(), mask)
    return loss, accuracy, mask.sum()


def train_sft(model, tokenizer, examples: Sequence[Example], cfg: Config,
              on_step: Callable[[int, dict], None] = lambda step, m: None) -> None:
    """Run ``cfg.sft.steps`` optimizer steps of SFT on random mini-batches (``examples``: the RL rows; see
    :func:`sft_examples` for ``sft.source``)."""
    items = sft_pairs(sft_examples(cfg, examples), tokenizer, cfg)
    s = cfg.sft
    opt = make_optimizer(model.parameters(), lr=s.lr, weight_decay=cfg.optim.weight_decay,
                         betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps)
    sched = make_scheduler(opt, warmup=s.warmup_steps, total=s.steps, schedule="cosine")
    gen = torch.Generator().manual_seed(cfg.train.seed)
    model.train()
    seen = 0.0
    for step in range(s.steps):
        t0 = time.perf_counter()
        idx = torch.randint(len(items), (min(s.batch_size, len(items)),), generator=gen).tolist()
        loss, accuracy, n_tokens = sft_step_loss(model, [items[i] for i in idx], tokenizer.pad_token_id)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        seen += n_tokens.item()
        on_step(step, {"sft/loss": loss.item(), "sft/mean_token_accuracy": accuracy.item(), "sft/num_tokens": seen,
                       "sft/samples_per_s": len(idx) / (time.perf_counter() - t0),
                       "sft/grad_norm": grad_norm.item(), "sft/lr": sched.get_last_lr()[0]})
