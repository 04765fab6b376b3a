"""Supervised fine-tuning: token-mean NLL on reference completions, with one of three loss masks.

``sft.loss_on``: ``all`` (prompt and completion), ``response`` (the completion
and its eos) or ``answer`` (the final answer and the eos only; see
``rlft.data.sft_data``). Metrics per step: ``sft/loss``,
``sft/mean_token_accuracy`` (share of loss tokens the model predicts as its
argmax), ``sft/num_tokens`` (loss tokens trained on so far), ``sft/samples_per_s``,
``sft/padding_frac`` (share of the forward passes' positions that are padding),
``sft/grad_norm``, ``sft/lr``. ``sft.max_tokens`` splits each mini-batch into
micro-batches of similar length under a token budget (less padding, bounded memory). The loss and the accuracy
come from the final hidden states and the output projection without the full logits where the model allows it
(``rlft.models.forward.response_logprobs``, ``train.logprob_chunk`` tokens at a time; 0: the full logits).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from rlft.config import Config
from rlft.core.ops import masked_sum
from rlft.data.schema import DataError, Example
from rlft.data.judge_data import PREFIX as JUDGE_PREFIX, judge_examples, judged_samples
from rlft.data.synthetic import configured_task
from rlft.data.sft_data import (load_sft_examples, response_weights, sft_rows, sft_system_prompt,
                                with_system_prompt)
from rlft.data.templates import encode_prompts
from rlft.insight.eval import prompt_tools
from rlft.models.forward import LOGPROB_CHUNK, response_logprobs
from rlft.rollout.batch import left_pad, right_pad
from rlft.rollout.multiturn import opened
from rlft.trainers.optim import make_optimizer, make_scheduler
from rlft.trainers.policy_pairs import sample_outcomes
from rlft.trainers.resumable import Checkpoints

Item = tuple[list[int], list[int], list[int]]  # prompt ids, target ids, loss weight (0/1) per target id


def sft_examples(cfg: Config, rl_examples: Sequence[Example]) -> list[Example]:
    """What SFT trains on: ``sft.source``'s rows, else the RL rows (their reference responses), with SFT's system
    prompt (``sft_system_prompt``: sft.system_prompt, else data.system_prompt)."""
    s = cfg.sft
    if s.source.startswith(JUDGE_PREFIX):  # a judge's demonstrations: "is this answer right?" by the task's rule
        problems = configured_task(s.source[len(JUDGE_PREFIX):], cfg.data, cfg.train.seed, 0)[0]
        judged = judge_examples(problems, cfg.eval.correct_fn, cfg.train.seed, s.judge_reference, s.judge_edits)
        if s.judge_policy:  # and the policy's own answers, its mistakes as it makes them
            judged += judged_samples(policy_samples(s.judge_policy, problems, cfg), s.judge_reference)
        if s.judge_reference:  # and the task's own demonstrations: the judge writes its reference answer
            judged += problems
        return with_system_prompt(judged, sft_system_prompt(cfg))
    if s.source.startswith("synthetic:"):  # a synthetic task's demonstrations, its problems drawn as data.source's
        return with_system_prompt(configured_task(s.source, cfg.data, cfg.train.seed, 0)[0], sft_system_prompt(cfg))
    if s.source:
        return load_sft_examples(s.source, s.train_split, sft_system_prompt(cfg))
    rows = opened(rl_examples, cfg)  # a multi-turn run: prompts as its episodes start (the first observation)
    return sft_rows(rows, cfg)  # the RL rows carry data.system_prompt already


def policy_samples(model_dir: str, problems: Sequence[Example],
                   cfg: Config) -> list[tuple[Example, list[str], list[bool]]]:
    """(problem, ``sft.judge_samples`` completions of the policy at ``model_dir``, the rule's verdicts) for every
    problem, sampled with the ``rollout.*`` settings (seeded by ``train.seed``)."""
    from rlft.models.loading import load_policy

    policy, tok = load_policy(model_dir, cfg.model)
    outcomes = sample_outcomes(policy, tok, problems, cfg, cfg.train.seed, k=cfg.sft.judge_samples,
                               key="sft.judge_policy")
    return [(ex, texts, verdicts) for ex, (_, texts, verdicts) in zip(problems, outcomes, strict=True)]


def sft_pairs(examples: Sequence[Example], tokenizer, cfg: Config) -> list[Item]:
    """(prompt ids, target ids, loss weights) for every example, as ``sft.loss_on`` says."""
    missing = [i for i, ex in enumerate(examples) if not ex.response]
    if missing:
        raise DataError(f"sft: {len(missing)} training rows have no reference response (first: row {missing[0]}); "
                        "set data.response_key, sft.source, or sft.steps=0")
    prompts = encode_prompts(examples, cfg.data.template, tokenizer, cfg.data.max_prompt_tokens, "sft data",
                             prompt_tools(cfg, cfg.data.template))  # the tools' schemas, as the episodes show them
    items = []
    for i, (p, ex) in enumerate(zip(prompts, examples)):
        try:
            items.append(sft_item(p, ex.response, tokenizer, cfg.sft.loss_on))
        except ValueError as e:
            raise DataError(f"sft data, row {i}: sft.loss_on=answer: {e}") from None
    return items


def sft_item(prompt_ids: list[int], response: str, tokenizer, loss_on: str) -> Item:
    """(prompt ids, target ids, loss weights) of one prompt and its response; ValueError when ``loss_on=answer``
    finds no final answer."""
    r, w = response_weights(response, tokenizer, loss_on)
    p = prompt_ids
    return (p[:1], p[1:] + r, [1] * (len(p) - 1) + w) if loss_on == "all" else (p, r, w)


def sft_step_parts(model, batch: Sequence[Item], pad_id: int, *,
                   chunk: int = LOGPROB_CHUNK) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(sum of NLL over weighted tokens, number of them the model predicts as its argmax, weighted tokens, padded
    positions of the forward pass) of one padded batch; sums, so micro-batches add up to the whole batch.
    ``chunk``: tokens per block of the log-prob head (``train.logprob_chunk``; 0: the full logits)."""
    p_ids, p_mask = left_pad([x[0] for x in batch], pad_id)
    r_ids, r_mask = right_pad([x[1] for x in batch], pad_id)
    weights, _ = right_pad([x[2] for x in batch], 0)  # (B, T) 0/1, 0 on padding
    logp, _, hit = response_logprobs(model, p_ids, p_mask, r_ids, r_mask, chunk=chunk, with_argmax=True)  # (B, T)
    mask = weights.to(logp.device).float()  # (B, T)
    nll = masked_sum(-logp, mask)  # ()
    correct = masked_sum(hit.float(), mask)  # ()
    n_tokens = int(mask.sum().item())
    return nll, correct, n_tokens, p_ids.numel() + r_ids.numel()


def sft_step_loss(model, batch: Sequence[Item], pad_id: int, *,
                  chunk: int = LOGPROB_CHUNK) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token-mean NLL over weighted tokens, argmax-accuracy over them, their count) of one batch."""
    nll, correct, n, _ = sft_step_parts(model, batch, pad_id, chunk=chunk)
    return nll / max(n, 1), correct / max(n, 1), torch.tensor(float(n))


def token_budget_batches(items: Sequence[Item], max_tokens: int) -> list[list[int]]:
    """Indices of ``items`` in micro-batches of similar length whose padded forward pass (rows x (longest prompt +
    longest target)) holds at most ``max_tokens`` positions; an item longer than the budget goes alone.
    ``max_tokens=0``: one micro-batch of everything.

    >>> token_budget_batches([([1], [1, 1], [1, 1]), ([1], [1] * 7, [1] * 7), ([1], [1], [1])], 8)
    [[2, 0], [1]]
    """
    if not max_tokens:
        return [list(range(len(items)))]
    order = sorted(range(len(items)), key=lambda i: (len(items[i][0]) + len(items[i][1]), i))
    out: list[list[int]] = []
    cur: list[int] = []
    width_p = width_t = 0
    for i in order:
        p, t = max(width_p, len(items[i][0])), max(width_t, len(items[i][1]))
        if cur and (len(cur) + 1) * (p + t) > max_tokens:
            out.append(cur)
            cur, p, t = [], len(items[i][0]), len(items[i][1])
        cur.append(i)
        width_p, width_t = p, t
    return out + [cur] if cur else out


def train_sft(model, tokenizer, examples: Sequence[Example], cfg: Config,
              on_step: Callable[[int, dict], None] = lambda step, m: None,
              rows: Sequence[Example] | None = None, *, checkpoints: Path | None = None,
              resume: Path | None = None) -> None:
    """Run ``cfg.sft.steps`` optimizer steps of SFT on random mini-batches (``examples``: the RL rows; see
    :func:`sft_examples` for ``sft.source``; ``rows``: what it returned, when read already).

    ``checkpoints``: the directory whose ``checkpoints/`` receive its checkpoints (``rlft.trainers.resumable``:
    every ``train.save_every`` steps and on a stop signal, which then ends the run); ``resume``: a checkpoint
    written there, whose model ``model`` already is, to continue from."""
    items = sft_pairs(sft_examples(cfg, examples) if rows is None else rows, tokenizer, cfg)
    s = cfg.sft
    opt = make_optimizer(model.parameters(), lr=s.lr, weight_decay=cfg.optim.weight_decay,
                         betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps)
    sched = make_scheduler(opt, warmup=s.warmup_steps, total=s.steps, schedule=s.schedule)
    gen = torch.Generator().manual_seed(cfg.train.seed)
    ckpts = Checkpoints(checkpoints, cfg, "SFT step", s.steps, model=model, tokenizer=tokenizer, optimizer=opt,
                        scheduler=sched)
    start, seen = 0, 0.0
    if resume is not None:
        saved = ckpts.restore(resume)
        gen.set_state(saved["generator"])  # the batches the uninterrupted run draws next
        start, seen = saved["step"], saved["num_tokens"]
    model.train()
    sft_updates(model, items, opt, sched, steps=s.steps, batch_size=s.batch_size, pad_id=tokenizer.pad_token_id,
                grad_clip=cfg.optim.grad_clip, gen=gen, on_step=on_step, max_tokens=s.max_tokens,
                chunk=cfg.train.logprob_chunk, start=start, seen=seen,
                between=lambda step, n: ckpts.after(step, {"generator": gen.get_state(), "num_tokens": n}))


def sft_updates(model, items: Sequence[Item], opt, sched, *, steps: int, batch_size: int, pad_id: int,
                grad_clip: float, gen: torch.Generator, on_step: Callable[[int, dict], None],
                max_tokens: int = 0, chunk: int = LOGPROB_CHUNK, start: int = 0, seen: float = 0.0,
                between: Callable[[int, float], None] = lambda step, seen: None) -> float:
    """Optimizer steps ``start`` to ``steps`` on mini-batches of ``items`` drawn with replacement by ``gen``;
    returns the loss tokens trained on (``seen`` before ``start``). Shared by SFT and rejection-sampling
    fine-tuning (``rlft.trainers.rft``). ``between(steps done, loss tokens so far)`` runs after each step (its
    checkpoints and stop signals: ``rlft.trainers.resumable``).

    With ``max_tokens`` each mini-batch runs as micro-batches of similar length under that token budget
    (:func:`token_budget_batches`), gradients accumulated so the loss is the whole mini-batch's token mean.
    ``chunk``: tokens per block of the log-prob head (``train.logprob_chunk``; 0: the full logits)."""
    for step in range(start, steps):
        t0 = time.perf_counter()
        idx = torch.randint(len(items), (min(batch_size, len(items)),), generator=gen).tolist()
        batch = [items[i] for i in idx]
        n_total = max(sum(1 for x in batch for w in x[2] if w), 1)  # weighted tokens of the whole batch
        nll_sum, correct_sum, positions = 0.0, 0.0, 0
        for group in token_budget_batches(batch, max_tokens):  # token-mean of the whole batch, summed in parts
            nll, correct, _, padded = sft_step_parts(model, [batch[i] for i in group], pad_id, chunk=chunk)
            (nll / n_total).backward()
            nll_sum, correct_sum, positions = nll_sum + nll.item(), correct_sum + correct.item(), positions + padded
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or float("inf"))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        seen += n_total
        real = sum(len(x[0]) + len(x[1]) for x in batch)
        on_step(step, {"sft/loss": nll_sum / n_total, "sft/mean_token_accuracy": correct_sum / n_total,
                       "sft/num_tokens": seen, "sft/samples_per_s": len(idx) / (time.perf_counter() - t0),
                       "sft/padding_frac": 1.0 - real / positions,
                       "sft/grad_norm": grad_norm.item(), "sft/lr": sched.get_last_lr()[0]})
        between(step + 1, seen)
    return seen
