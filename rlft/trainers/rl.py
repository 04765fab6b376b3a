"""The RL loop: rollout -> reward -> advantage -> (log-probs) -> update, one named phase each.

With one update pass per batch (``algo.epochs == 1`` and ``algo.minibatches == 1``)
the old log-probs are the detached log-probs of the loss's own forward pass, so
no separate forward runs; a reference model exists only when a KL term needs it.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import Tensor

from rlft.config import Config
from rlft.core.advantages import ADVANTAGES, AdvantageInputs, group_stats
from rlft.core.kl import KL_ESTIMATORS
from rlft.core.losses import POLICY_LOSSES, aggregate_parts, aggregation_weight
from rlft.core.ops import masked_mean
from rlft.data.schema import Example
from rlft.models.forward import response_logprobs
from rlft.rewards import score_batch
from rlft.rollout.batch import Batch
from rlft.rollout.hf import generate


class PromptSampler:
    """Walks a seeded permutation of the training prompts, epoch after epoch; its position is checkpointed."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self.epoch, self.pos = 0, 0

    def _perm(self) -> list[int]:
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            perm = self._perm()
            grab = perm[self.pos:self.pos + k - len(out)]
            out += grab
            self.pos += len(grab)
            if self.pos >= self.n:
                self.epoch, self.pos = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "n": self.n, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if (state["n"], state["seed"]) != (self.n, self.seed):
            raise ValueError(f"checkpoint data position is for {state['n']} prompts with seed {state['seed']}, "
                             f"this run has {self.n} prompts with seed {self.seed}")
        self.epoch, self.pos = state["epoch"], state["pos"]


@dataclass
class RLState:
    policy: torch.nn.Module
    tokenizer: object
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: PromptSampler
    examples: Sequence[Example]
    prompts: list[list[int]]  # token ids, one per example
    ref: torch.nn.Module | None = None
    step: int = 0


@contextmanager
def _timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    timings[f"timing_s/{phase}"] = time.perf_counter() - t0


def rl_step(state: RLState, cfg: Config) -> dict[str, float]:
    """One RL step over P prompts x G samples; returns the step's metrics."""
    t: dict[str, float] = {}  # timing_s/<phase>
    t_start = time.perf_counter()
    idx = state.sampler.take(cfg.train.prompts_per_step)
    examples = [state.examples[i] for i in idx]
    with _timed(t, "rollout"):
        batch = generate(state.policy, state.tokenizer, [state.prompts[i] for i in idx],
                         group_size=cfg.algo.group_size, max_new_tokens=cfg.rollout.max_new_tokens,
                         temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k)
    with _timed(t, "reward"):
        samples = [ex.to_mapping() for ex in examples for _ in range(cfg.algo.group_size)]
        scored = score_batch(batch.texts, samples, cfg.reward.fns, cfg.reward.weights, timeout_s=cfg.reward.timeout_s)
        batch.scores = torch.tensor([math.nan if s is None else s for s in scored.total])  # (B,)
        adv_in = AdvantageInputs(batch.scores, batch.response_mask, cfg.algo.group_size)
        batch.adv, _ = ADVANTAGES.get(cfg.algo.advantage)(adv_in, cfg.algo)  # (B, T) adv; ret unused without a critic
    with _timed(t, "logprob"):
        fill_logprobs(state, batch, cfg)
    with _timed(t, "update"):
        metrics = update_policy(state, batch, cfg)
    metrics.update(reward_metrics(batch, scored, cfg))
    metrics.update(t)
    n_tokens = (batch.prompt_mask.sum() + batch.response_mask.sum()).item()
    metrics["perf/tokens_per_s"] = n_tokens / max(time.perf_counter() - t_start, 1e-9)
    state.step += 1
    return metrics


@torch.no_grad()
def fill_logprobs(state: RLState, batch: Batch, cfg: Config) -> None:
    """Old log-probs (only with several passes) and reference log-probs (only with a KL term)."""
    models = {}
    if not cfg.algo.single_pass:
        models["old_logp"] = state.policy
    if cfg.algo.needs_ref:
        models["ref_logp"] = state.ref
    for name, model in models.items():
        parts = [response_logprobs(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
                                   temperature=cfg.rollout.temperature)[0].cpu()
                 for mb in _micro(batch, cfg.train.micro_batch_size)]
        setattr(batch, name, torch.cat(parts))


def _micro(batch: Batch, size: int) -> Iterator[Batch]:
    for s in range(0, len(batch), size):
        yield batch.index(slice(s, s + size))


def update_policy(state: RLState, batch: Batch, cfg: Config) -> dict[str, float]:
    """``algo.epochs`` passes of ``algo.minibatches`` optimizer steps over the batch."""
    a = cfg.algo
    sums: dict[str, float] = {}
    n_opt = 0
    gen = torch.Generator().manual_seed(cfg.train.seed * 100003 + state.step)
    for _ in range(a.epochs):
        order = torch.randperm(len(batch), generator=gen) if a.minibatches > 1 else torch.arange(len(batch))
        for mb_idx in order.chunk(a.minibatches):
            for k, v in _minibatch_step(state, batch.index(mb_idx), cfg).items():
                sums[k] = sums.get(k, 0.0) + v
            n_opt += 1
    return {k: v / n_opt for k, v in sums.items()}


def _minibatch_step(state: RLState, mb: Batch, cfg: Config) -> dict[str, float]:
    """One optimizer step; micro-batches accumulate gradients of exactly the mini-batch's loss."""
    a = cfg.algo
    policy = state.policy
    device = next(policy.parameters()).device
    max_len = cfg.rollout.max_new_tokens
    # normaliser of the whole mini-batch (clamped: a mini-batch without valid tokens contributes a zero loss)
    total_den = aggregation_weight(mb.response_mask.float(), a.loss_agg, max_len).clamp(min=1e-8)
    totals: dict[str, float] = {}
    n_tok = mb.response_mask.sum().item()
    for micro in _micro(mb, cfg.train.micro_batch_size):
        mask = micro.response_mask.to(device).float()  # (b, T)
        logp, ent = response_logprobs(policy, micro.prompt_ids, micro.prompt_mask, micro.response_ids,
                                      micro.response_mask, temperature=cfg.rollout.temperature,
                                      with_entropy=True, entropy_grad=a.entropy_coef > 0)
        old_logp = logp.detach() if a.single_pass else micro.old_logp.to(device)
        pg_mat, pg_metrics = POLICY_LOSSES.get(a.policy_loss)(logp, old_logp, micro.adv.to(device), mask, a)
        loss_mat = pg_mat
        terms = {"actor/pg_loss": pg_mat}
        if a.needs_ref:
            kl_mat = KL_ESTIMATORS.get(a.kl_estimator)(logp, micro.ref_logp.to(device))  # (b, T)
            loss_mat = loss_mat + a.kl_coef * kl_mat
            terms["actor/kl_loss"] = kl_mat
        if a.entropy_coef > 0:
            loss_mat = loss_mat - a.entropy_coef * ent
        num, _ = aggregate_parts(loss_mat, mask, a.loss_agg, max_len)
        (num / total_den).backward()
        share = mask.sum().item() / max(n_tok, 1)  # token-weighted average of per-micro-batch metrics
        with torch.no_grad():
            for name, mat in terms.items():
                totals[name] = totals.get(name, 0.0) + (aggregate_parts(mat.detach(), mask, a.loss_agg, max_len)[0]
                                                        / total_den).item()
            totals["actor/entropy"] = totals.get("actor/entropy", 0.0) + masked_mean(ent.detach(), mask).item() * share
            for k, v in pg_metrics.items():
                totals[f"actor/{k}"] = totals.get(f"actor/{k}", 0.0) + float(v) * share
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), clip)
    totals["actor/lr"] = state.scheduler.get_last_lr()[0]
    if torch.isfinite(grad_norm):
        state.optimizer.step()
    totals["actor/grad_norm"] = grad_norm.item()
    totals["actor/skipped_steps"] = float(not torch.isfinite(grad_norm))
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    return totals


def reward_metrics(batch: Batch, scored, cfg: Config) -> dict[str, float]:
    scores = batch.scores
    valid = ~torch.isnan(scores)
    vals = scores[valid]
    _, _, zero_std = group_stats(scores, cfg.algo.group_size)
    lengths = batch.response_lengths.float()
    out = {
        "reward/mean": vals.mean().item() if vals.numel() else 0.0,
        "reward/std": vals.std().item() if vals.numel() > 1 else 0.0,
        "reward/unscorable_frac": 1.0 - valid.float().mean().item(),
        "frac_reward_zero_std": zero_std.float().mean().item(),
        "response_length/mean": lengths.mean().item(),
        "response_length/max": lengths.max().item(),
        "response_length/clip_ratio": batch.truncated.float().mean().item(),
    }
    for name, values in scored.per_fn.items():
        ok = [v for v in values if v is not None]
        out[f"reward/{name}/mean"] = sum(ok) / len(ok) if ok else 0.0
        out[f"reward/{name}/errors"] = float(scored.errors.get(name, 0))
    return out

