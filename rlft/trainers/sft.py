"""Supervised warm-up: token-mean NLL on reference responses (optionally on prompts too)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from rlft.config import Config
from rlft.core.losses import sft_loss
from rlft.data.schema import DataError, Example
from rlft.data.templates import encode_prompts, encode_response
from rlft.models.forward import response_logprobs
from rlft.rollout.batch import left_pad, right_pad
from rlft.trainers.optim import make_optimizer, make_scheduler


def sft_pairs(examples: Sequence[Example], tokenizer, cfg: Config) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) for every example; with ``loss_on='all'`` the prompt joins the target."""
    missing = [i for i, ex in enumerate(examples) if not ex.response]
    if missing:
        raise DataError(f"sft: {len(missing)} training rows have no reference response (first: row {missing[0]}); "
                        "set data.response_key or sft.steps=0")
    prompts = encode_prompts(examples, cfg.data.template, tokenizer, cfg.data.max_prompt_tokens, "sft data")
    pairs = []
    for p, ex in zip(prompts, examples):
        r = encode_response(ex.response, tokenizer)
        pairs.append((p[:1], p[1:] + r) if cfg.sft.loss_on == "all" else (p, r))
    return pairs


def train_sft(model, tokenizer, examples: Sequence[Example], cfg: Config,
              on_step: Callable[[int, dict], None] = lambda step, m: None) -> None:
    """Run ``cfg.sft.steps`` optimizer steps of SFT on random mini-batches of ``examples``."""
    pairs = sft_pairs(examples, tokenizer, cfg)
    s = cfg.sft
    opt = make_optimizer(model.parameters(), lr=s.lr, weight_decay=cfg.optim.weight_decay,
                         betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps)
    sched = make_scheduler(opt, warmup=s.warmup_steps, total=s.steps, schedule="cosine")
    gen = torch.Generator().manual_seed(cfg.train.seed)
    model.train()
    for step in range(s.steps):
        idx = torch.randint(len(pairs), (min(s.batch_size, len(pairs)),), generator=gen).tolist()
        p_ids, p_mask = left_pad([pairs[i][0] for i in idx], tokenizer.pad_token_id)
        r_ids, r_mask = right_pad([pairs[i][1] for i in idx], tokenizer.pad_token_id)
        logp, _ = response_logprobs(model, p_ids, p_mask, r_ids, r_mask)
        loss = sft_loss(logp, r_mask.to(logp.device).float())
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        on_step(step, {"sft/loss": loss.item(), "sft/grad_norm": grad_norm.item(), "sft/lr": sched.get_last_lr()[0]})
