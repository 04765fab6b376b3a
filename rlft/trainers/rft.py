"""Rejection-sampling fine-tuning (RFT): sample k completions per prompt, keep those the reward accepts, fine-tune.

A completion is accepted when its weighted reward (``reward.fns``, scored as the
RL loop scores it) is ``>= rft.min_reward``; an unscorable one (None / NaN) and
an empty one never are. Identical accepted completions of one prompt are kept
once (Yuan et al. 2023, "Scaling relationship on learning mathematical reasoning",
§3.3: distinct reasoning paths). ``rft.keep`` then selects among them (``KEEP``):
every one, or only the shortest (Kimi k1.5, Team et al. 2025, §2.4 long2short:
shortest rejection sampling; ties go to the earliest sample).

Two schedules of the same budget (``MODES``), both over the same prompts (one
seeded walk through the training set):

* ``offline`` -- every ``rounds x P x k`` completion is drawn from the starting
  model before any update (RFT of Yuan et al. 2023), then ``rounds x
  steps_per_round`` fine-tuning steps run on the pooled accepted completions;
* ``online`` -- each round draws ``P x k`` completions from the current policy and
  runs ``steps_per_round`` steps on that round's accepted completions (RAFT, Dong
  et al. 2023; expert iteration), or with ``rft.pool=growing`` on every completion
  accepted so far.

``rft.step_schedule`` spreads the ``rounds x steps_per_round`` steps over the
rounds: evenly (``constant``) or in proportion to the round number (``linear``,
:func:`round_steps`), so an online run with a growing pool takes few steps while
its pool is small. One optimizer (AdamW, ``rft.lr``, constant after
``rft.warmup_steps``) lives across the rounds; the loss is SFT's (``rlft.trainers.sft``) on ``rft.loss_on``.
Metrics per round: ``rft/accept_rate``, ``rft/kept``, ``rft/samples_total``
(completions drawn so far: the budget), ``rft/prompts_solved`` (prompts of the
round with an accepted completion), ``rft/kept_length/mean`` (tokens),
``rft/reward/mean``, ``rft/loss`` and ``rft/mean_token_accuracy`` (means over the
round's steps), ``rft/steps``, ``timing_s/{sample,train}``. Offline logs its
sampling metrics (of the whole pool) in its first round only.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from rlft.config import Config
from rlft.data.schema import Example
from rlft.data.templates import encode_prompts
from rlft.registry import Registry
from rlft.rollout.hf import generate, sampling_args
from rlft.runs import checkpoint, stop
from rlft.trainers.optim import make_optimizer, make_scheduler
from rlft.trainers.state import PromptSampler
from rlft.trainers.resumable import Checkpoints
from rlft.trainers.rl import score
from rlft.trainers.sft import Item, sft_item, sft_updates

KeepFn = Callable[[list[int], Sequence[int]], list[int]]
KEEP: Registry[KeepFn] = Registry("rft.keep")


@KEEP.register("accepted")
def keep_accepted(distinct: list[int], lengths: Sequence[int]) -> list[int]:
    """Every distinct accepted completion."""
    return distinct


@KEEP.register("shortest")
def keep_shortest(distinct: list[int], lengths: Sequence[int]) -> list[int]:
    """The shortest distinct accepted completion (Kimi k1.5 long2short); the earliest on a tie."""
    return [min(distinct, key=lambda i: lengths[i])] if distinct else []


def select_completions(texts: Sequence[str], rewards: Sequence[float | None], lengths: Sequence[int],
                       keep: str, min_reward: float) -> list[int]:
    """Indices of one prompt's k completions to fine-tune on, in sample order.

    >>> select_completions(["a", "bb", "a", ""], [1.0, 1.0, 1.0, 1.0], [1, 2, 1, 0], "accepted", 1.0)
    [0, 1]
    >>> select_completions(["ccc", "bb", "a"], [1.0, 1.0, 0.0], [3, 2, 1], "shortest", 1.0)
    [1]
    """
    accepted = [i for i, r in enumerate(rewards) if is_accepted(r, min_reward) and texts[i]]
    first = {}
    for i in accepted:  # identical completions of a prompt: the first one stands for all
        first.setdefault(texts[i], i)
    return KEEP.get(keep)(sorted(first.values()), lengths)


def is_accepted(reward: float | None, min_reward: float) -> bool:
    """A scorable reward at or above the threshold (None and NaN never pass)."""
    return reward is not None and not math.isnan(reward) and reward >= min_reward


# --------------------------------------------------------------------------- one round of sampling


Draw = Callable[[], tuple[list[Item], Counter]]  # one round: the kept items and the round's counts
MODES: Registry[Callable[..., Iterator[tuple[list[Item], Counter]]]] = Registry("rft.mode")  # (draw, rounds, pool,
# start, kept): the rounds' pools and counts, from round ``start`` with ``kept`` the pool of the last one


@MODES.register("online")
def online(draw: Draw, rounds: int, pool: str, start: int = 0,
           kept: Sequence[Item] = ()) -> Iterator[tuple[list[Item], Counter]]:
    """Each round samples from the policy as the previous rounds left it, and trains on what it kept
    (``pool=round``) or on everything kept so far (``pool=growing``). ``start``, ``kept``: a resumed run's rounds
    done and the pool of the last one."""
    kept = list(kept)
    for _ in range(start, rounds):
        items, counts = draw()
        kept = kept + items if pool == "growing" else items
        yield kept, counts


@MODES.register("offline")
def offline(draw: Draw, rounds: int, pool: str, start: int = 0,
            kept: Sequence[Item] = ()) -> Iterator[tuple[list[Item], Counter]]:
    """Every round is drawn before the first update (from the starting model); each round trains on the whole
    pool (``pool`` changes nothing: everything is drawn already). Resumed after ``start`` rounds, ``kept`` is that
    pool."""
    if start:
        everything, counts = list(kept), Counter()
    else:
        drawn = [draw() for _ in range(rounds)]
        everything = [item for items, _ in drawn for item in items]
        counts = Counter()
        for _, c in drawn:
            counts.update(c)  # update adds every value (Counter's + would drop a total reward <= 0)
    for r in range(start, rounds):
        yield everything, counts if r == 0 else Counter()


def round_steps(schedule: str, rounds: int, steps_per_round: int) -> list[int]:
    """Optimizer steps of each round; ``rounds x steps_per_round`` in all, whatever the schedule.

    >>> round_steps("constant", 4, 10)
    [10, 10, 10, 10]
    >>> round_steps("linear", 4, 10)  # shares 1:2:3:4 of 40
    [4, 8, 12, 16]
    >>> sum(round_steps("linear", 16, 16))
    256
    """
    total = rounds * steps_per_round
    if schedule == "constant":
        return [steps_per_round] * rounds
    if schedule == "linear":  # cumulative share i(i+1)/2 of rounds(rounds+1)/2, rounded: the parts sum to total
        cum = [round(total * i * (i + 1) / (rounds * (rounds + 1))) for i in range(rounds + 1)]
        return [b - a for a, b in zip(cum, cum[1:])]
    raise ValueError(f"rft.step_schedule: unknown schedule {schedule!r}")


def sample_round(policy, tokenizer, prompts: list[list[int]], examples: Sequence[Example],
                 cfg: Config) -> tuple[list[Item], Counter]:
    """Draw k completions for each of P prompts, score them, select; returns the kept (prompt, target, weights)
    items and the round's counts (see :func:`round_metrics`)."""
    r, k = cfg.rft, cfg.rft.samples_per_prompt
    batch = generate(policy, tokenizer, prompts, group_size=k, **sampling_args(cfg.rollout))
    score(batch, examples, cfg)  # batch.scores (P*k,), NaN where unscorable
    rewards = [None if math.isnan(s) else s for s in batch.scores.tolist()]  # (P*k,)
    lengths = batch.response_lengths.tolist()  # (P*k,) tokens, eos included
    items, counts = [], Counter(prompts=len(prompts), sampled=len(rewards))
    for i, p in enumerate(prompts):
        rows = slice(i * k, (i + 1) * k)
        kept = select_completions(batch.texts[rows], rewards[rows], lengths[rows], r.keep, r.min_reward)
        items += [sft_item(p, batch.texts[i * k + j], tokenizer, r.loss_on) for j in kept]
        counts["accepted"] += sum(is_accepted(x, r.min_reward) for x in rewards[rows])
        counts["solved"] += bool(kept)
        counts["kept"] += len(kept)
        counts["kept_tokens"] += sum(lengths[i * k + j] for j in kept)
    valid = [x for x in rewards if x is not None]
    counts["reward_sum"], counts["scored"] = sum(valid), len(valid)
    return items, counts


def round_metrics(counts: Counter) -> dict[str, float]:
    """The sampling metrics of a round's counts (empty for a round that drew nothing)."""
    if not counts["sampled"]:
        return {}
    return {"rft/accept_rate": counts["accepted"] / counts["sampled"], "rft/kept": float(counts["kept"]),
            "rft/prompts_solved": float(counts["solved"]),
            "rft/kept_length/mean": counts["kept_tokens"] / max(counts["kept"], 1),
            "rft/reward/mean": counts["reward_sum"] / max(counts["scored"], 1)}


# --------------------------------------------------------------------------- the loop


def train_rft(policy, tokenizer, examples: Sequence[Example], cfg: Config,
              on_round: Callable[[int, dict], None] = lambda r, m: None, *, checkpoints: Path | None = None,
              resume: Path | None = None) -> dict[str, float]:
    """Run ``rft.rounds`` rounds of ``rft.mode`` on the training ``examples``; returns the totals
    (``rft/samples_total``, ``rft/accept_rate``, ``rft/kept_total``, ``rft/steps_total``).

    ``checkpoints``: the directory whose ``checkpoints/`` receive a checkpoint after every ``train.save_every``
    rounds and on a stop signal (``rlft.trainers.resumable``; one arriving while a round samples abandons the
    round, whose prompts the resumed run draws again); ``resume``: one of them, whose weights ``policy`` has."""
    r = cfg.rft
    prompts = encode_prompts(examples, cfg.data.template, tokenizer, cfg.data.max_prompt_tokens, "train data")
    sampler = PromptSampler(len(examples), cfg.train.seed)
    o = cfg.optim
    opt = make_optimizer(policy.parameters(), lr=r.lr, weight_decay=o.weight_decay, betas=(o.beta1, o.beta2),
                         eps=o.eps)
    sched = make_scheduler(opt, warmup=r.warmup_steps, total=r.rounds * r.steps_per_round, schedule="constant")
    gen = torch.Generator().manual_seed(cfg.train.seed)
    totals = Counter()
    ckpts = Checkpoints(checkpoints, cfg, "RFT round", r.rounds, model=policy, tokenizer=tokenizer, optimizer=opt,
                        scheduler=sched)
    start, pool = 0, []
    if resume is not None:
        saved = ckpts.restore(resume)
        gen.set_state(saved["generator"])
        sampler.load_state_dict(saved["sampler"])
        totals.update(saved["totals"])
        start, pool = saved["step"], saved["pool"]

    def draw() -> tuple[list[Item], Counter]:
        t0 = time.perf_counter()
        idx = sampler.take(r.prompts_per_round)
        items, counts = sample_round(policy, tokenizer, [prompts[i] for i in idx], [examples[i] for i in idx], cfg)
        counts["sample_s"] = time.perf_counter() - t0
        totals.update(counts)
        return items, counts

    def position(items: list[Item]) -> dict:  # what a checkpoint after a round holds besides the model
        return {"generator": gen.get_state(), "sampler": sampler.state_dict(), "totals": dict(totals),
                "pool": items}

    schedule = round_steps(r.step_schedule, r.rounds, r.steps_per_round)
    rounds = MODES.get(r.mode)(draw, r.rounds, r.pool, start, pool)
    for i in range(start, r.rounds):
        mark = sampler.state_dict(), checkpoint.rng_state(), Counter(totals)
        try:
            items, counts = next(rounds)
        except stop.Stopping as e:  # while sampling: back to the end of the last round, its checkpoint
            sampler.load_state_dict(mark[0])
            checkpoint.set_rng_state(mark[1])
            totals = mark[2]
            raise ckpts.stopped(e.signum, i, position(pool), f"during RFT round {i + 1} of {r.rounds}") from None
        on_round(i, train_round(policy, tokenizer, items, counts, schedule[i] if items else 0, opt, sched, gen, cfg,
                                totals))  # nothing accepted yet: no update this round
        pool = items
        ckpts.after(i + 1, position(pool))
    return {"rft/samples_total": float(totals["sampled"]),
            "rft/accept_rate": totals["accepted"] / max(totals["sampled"], 1),
            "rft/kept_total": float(totals["kept"]), "rft/steps_total": float(totals["steps"])}


def train_round(policy, tokenizer, items: list[Item], counts: Counter, steps: int, opt, sched, gen: torch.Generator,
                cfg: Config, totals: Counter) -> dict[str, float]:
    """``steps`` fine-tuning steps on a round's pool ``items``; returns the round's metrics (``counts``: its
    sampling counts)."""
    t0 = time.perf_counter()
    policy.train()
    losses = []
    sft_updates(policy, items, opt, sched, steps=steps, batch_size=cfg.rft.batch_size, pad_id=tokenizer.pad_token_id,
                grad_clip=cfg.optim.grad_clip, gen=gen, on_step=lambda s, m: losses.append(m),
                chunk=cfg.train.logprob_chunk)
    metrics = {**round_metrics(counts), "rft/samples_total": float(totals["sampled"]), "rft/steps": float(steps),
               "rft/pool": float(len(items)), "timing_s/train": time.perf_counter() - t0}
    if counts["sampled"]:
        metrics["timing_s/sample"] = counts["sample_s"]
    if losses:
        for key in ("loss", "mean_token_accuracy"):
            metrics[f"rft/{key}"] = sum(m[f"sft/{key}"] for m in losses) / len(losses)
    totals["steps"] += steps
    return metrics


def forced_mode(cfg: Config, mode: str) -> Config:
    """``cfg`` with ``rft.mode`` set (the stages ``rft_offline`` / ``rft_online``)."""
    return dataclasses.replace(cfg, rft=dataclasses.replace(cfg.rft, mode=mode))
