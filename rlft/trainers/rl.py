"""The RL loop: rollout -> reward -> (log-probs, values) -> advantage -> update, one named phase each.

Every algorithm is the same loop with different registry entries and switches
(``rlft.recipe.presets``). With one update pass per batch whose advantages do not need
the rollout policy's log-probs (``algo.single_pass``), the old log-probs are the
detached log-probs of the loss's own forward pass, so no separate forward runs;
a reference model exists only when a KL term needs it, a critic only when the
advantage estimator needs values.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch

from rlft.config import Config, ConfigError
from rlft.core.advantages import ADVANTAGES, AdvantageInputs, ema_update, group_stats, mean_return
from rlft.core.kl import PenaltyCoefController, k3, kl_penalty_rewards
from rlft.core.ops import masked_mean, masked_sum
from rlft.core.shaping import informative_groups, overlong_filter, soft_overlong_penalty
from rlft.core.value import explained_variance
from rlft.data.schema import Example
from rlft.insight.health import ENV
from rlft.parallel.launch import strategy
from rlft.models.forward import autocast
from rlft.rewards import score_batch
from rlft.rewards.calls import left_running
from rlft.rewards.scoring import ScoreResult
from rlft.rewards.steps import step_metrics, step_tensors
from rlft.rewards.terms import built
from rlft.rollout.batch import Batch, cat_batches
from rlft.rollout.hf import generate, samples_exactly, sampling_args, turn_sampler
from rlft.rollout.episodes import episode_metrics
from rlft.rollout.multiturn import rollout_env
from rlft.rollout.partial import finished_batch, partial_metrics
from rlft.trainers import hacking, trl_names
from rlft.trainers.distill import distill_advantages, distill_logprobs
from rlft.trainers.pieces import with_pieces
from rlft.trainers.roles import role_advantages, role_metrics, score_roles
from rlft.trainers.state import RLState
from rlft.trainers.update import batch_logprobs, micro_batches, shares_prefix, update


@contextmanager
def _timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    key = f"timing_s/{phase}"
    timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0  # phases repeated by dynamic sampling add up


def rl_step(state: RLState, cfg: Config, *, train_policy: bool = True) -> dict[str, float]:
    """One RL step over P prompts x G samples; returns the step's metrics.

    ``train_policy=False`` updates only the critic (VAPO value pre-training on the frozen policy's rollouts).
    """
    t: dict[str, float] = {}  # timing_s/<phase>
    t_start = time.perf_counter()
    if state.rollouts is not None and train_policy:  # one-step-off: the batch sampled during the last update
        batch, metrics = state.rollouts.next(state, cfg, t)
    else:
        with strategy().gathered(state.policy):  # a sharded policy: whole weights for sampling
            batch, metrics = collect(state, cfg, t)
    with _timed(t, "logprob"):  # each sharded model whole for its own pass only, one at a time
        metrics.update(fill_logprobs(state, batch, cfg))
    with _timed(t, "advantage"):
        metrics.update(compute_advantages(state, batch, cfg))
    state.last_batch = batch
    with _timed(t, "logprob"):  # an agent's broken-off chains join the update with their episode's advantage
        trained, found = with_pieces(batch, lambda sub: fill_logprobs(state, sub, cfg),
                                     state.tokenizer.pad_token_id)
        metrics.update(found)
    with _timed(t, "update"):
        metrics.update(update(state, trained, cfg, train_policy=train_policy))
        if state.penalty_ctl is not None and train_policy:  # PPO §4: d = KL(pi_old || pi) after the update
            with strategy().gathered(state.policy):
                metrics["actor/ppo_penalty_kl_post"] = penalty_kl(state, batch, cfg)
            state.penalty_ctl.update(metrics["actor/ppo_penalty_kl_post"], n_steps=1)
    if state.kl_ctl is not None and train_policy:
        state.kl_ctl.update(metrics["actor/kl_seq"], n_steps=len(batch))  # Ziegler et al. 2019 §2.2: KL per sequence
    metrics.update(t)
    n_tokens = (batch.prompt_mask.sum() + batch.response_mask.sum()).item()
    metrics["perf/tokens_per_s"] = n_tokens / max(time.perf_counter() - t_start, 1e-9)
    if train_policy:
        state.step += 1
        state.num_tokens += int(n_tokens)
        metrics["num_tokens"] = float(state.num_tokens)  # TRL's name: prompt + response tokens trained on so far
        if cfg.algo.ref_refresh_every:  # the next step's KL term is to the policy as it is now
            refresh = state.step % cfg.algo.ref_refresh_every == 0
            if refresh:
                state.refresh_ref()
            metrics["actor/ref_refreshed"] = float(refresh)
        metrics.update(hacking.tracker_metrics(state.hacking, metrics))
        metrics.update(count_skips(state, metrics))
        metrics.update(trl_names.update_metrics(metrics, state.scheduler.get_last_lr()[0]))  # TRL's names
        if state.rm_refresh is not None and state.step % cfg.rm.refresh_every == 0:
            with _timed(t, "rm_refresh"):
                metrics.update(state.rm_refresh.refresh(cfg, seed=cfg.train.seed + state.step))
            metrics.update(t)
    return metrics


def sample_records(state: RLState, step: int, n_groups: int) -> list[dict]:
    """The first ``n_groups`` groups of the last batch, one record per sample: prompt, completion, each reward,
    the total, the mean advantage over its response tokens, its length, the rule's verdict."""
    batch = state.last_batch
    if batch is None:
        return []
    G, tok = batch.group_size, state.tokenizer
    rows = range(min(len(batch), n_groups * G))
    lengths = batch.response_lengths
    out = []
    for i in rows:
        prompt = tok.decode(batch.prompt_ids[i][batch.prompt_mask[i].bool()], skip_special_tokens=True)
        adv = None if batch.adv is None else _mean_advantage(batch, i, int(lengths[i]))
        score = float(batch.scores[i])
        record = {"step": step, "group": i // G, "prompt": prompt, "completion": batch.texts[i],
                  "reward": score if math.isfinite(score) else None,
                  "rewards": {k: v[i] for k, v in state.reward_parts.items()},
                  "advantage": adv, "length": int(lengths[i]),
                  "correct": bool(batch.correct[i]) if batch.correct is not None else None}
        if batch.episodes:  # a trajectory: who wrote what, turn by turn
            record["episode"] = batch.episodes[i]
        out.append(record)
    return out


def _mean_advantage(batch: Batch, i: int, n: int) -> float:
    """Row ``i``'s mean advantage over the ``n`` tokens the policy wrote (0.0 when it wrote none)."""
    return masked_mean(batch.adv[i], batch.action_mask[i]).item() if n else 0.0


def count_skips(state: RLState, metrics: dict[str, float]) -> dict[str, float]:
    """``health/skipped_steps`` (RL steps so far whose every policy update met a non-finite loss or gradient, and
    so changed no weight) and ``health/consecutive_skips`` (such steps in a row, ending at this one)."""
    skipped = metrics.get("actor/skipped_steps", 0.0) >= 1.0  # the mean over the step's optimizer steps
    state.skipped_steps += skipped
    state.consecutive_skips = state.consecutive_skips + 1 if skipped else 0
    return {"health/skipped_steps": float(state.skipped_steps),
            "health/consecutive_skips": float(state.consecutive_skips)}


PENALTY_LOSSES = ("ppo_penalty",)  # policy losses that read the adaptive beta (cfg.penalty_coef)


def penalty_controller(state: RLState, cfg: Config) -> PenaltyCoefController | None:
    """The PPO-penalty beta of this run: the state's own (built earlier or restored from a checkpoint), else a new
    one from ``algo.penalty_coef`` / ``algo.penalty_target`` when the policy loss reads it; None otherwise."""
    a = cfg.algo
    if state.penalty_ctl is not None or a.policy_loss not in PENALTY_LOSSES:
        return state.penalty_ctl
    return PenaltyCoefController(a.penalty_coef, a.penalty_target)


@torch.no_grad()
def penalty_kl(state: RLState, batch: Batch, cfg: Config) -> float:
    """d of PPO §4: the mean over the batch's loss tokens of k3 of KL(pi_old || pi), pi the policy after the update.

    One extra forward pass: the in-update ``actor/ppo_penalty_kl`` averages steps measured *before* each step
    (the first is 0), which would bias d low by the number of optimizer steps.
    """
    num, den = 0.0, 0.0
    for _, mb in micro_batches(batch.index(state.dist.share(len(batch))), cfg.train.micro_batch_size,
                               cfg.train.micro_batch_tokens, shares_prefix(state.policy, cfg)):
        logp = batch_logprobs(state.policy, mb, cfg)[0].cpu()  # (b, T)
        kl = k3(mb.old_logp, logp)  # (b, T)  r = pi / pi_old, samples of pi_old: (r - 1) - log r
        num += masked_sum(kl, mb.loss_mask).item()
        den += (mb.loss_mask != 0).sum().item()
    total = state.dist.sum_floats({"num": num, "den": den})  # over every process's rows
    return total["num"] / max(total["den"], 1.0)


# --------------------------------------------------------------------------- rollout and reward


def collect(state: RLState, cfg: Config, t: dict[str, float],
            step: int | None = None) -> tuple[Batch, dict[str, float]]:
    """Generate and score RL step ``step``'s batch (default: the next one, ``state.step + 1``); with dynamic
    sampling, keep only informative groups (DAPO §3.2).

    Dynamic sampling draws rounds of P prompts until P groups with unequal rewards
    are kept or ``algo.max_sample_rounds`` extra rounds are spent; it then trains on
    what it kept (fewer groups), or, when nothing was kept, on the last round (whose
    advantages are all 0). Reward metrics describe every sample drawn, and so do the
    per-prompt statistics (``state.stats``, the rule's verdicts), which every round updates. ``step``'s reward
    weights (``reward.fns``' schedules) score the batch.
    """
    step = state.step + 1 if step is None else step
    a, P, G = cfg.algo, cfg.train.prompts_per_step, cfg.algo.group_size
    drawn: list[tuple[Batch, ScoreResult]] = []
    kept: list[Batch] = []
    kept_parts: list[dict[str, list]] = []  # each reward's values for the kept rows, in order
    n_kept = 0
    partial: dict[str, float] = {}
    for _ in range(1 + (a.max_sample_rounds if a.dynamic_sampling else 0)):
        if state.partial is not None:  # rollout.partial_tokens: the groups that finished this step (one process)
            idx, batch, scored, partial = _partial_share(state, cfg, t, step)
        else:
            idx = state.sampler.take(P, step)  # the same P prompts in every process
            batch, scored = _rollout_share(state, cfg, idx[state.dist.share(P)], t, step)
        if state.dist.active:  # every process gets the whole round, in prompt order
            parts = state.dist.gather((batch.to(torch.device("cpu")), scored))
            batch, scored = cat_batches([b for b, _ in parts]), merge_scores([s for _, s in parts])
        if state.rm_refresh is not None:
            state.rm_refresh.record([state.examples[i] for i in idx], batch.texts, batch.correct)
        if state.stats is not None and batch.correct is not None:  # every process: the whole round's verdicts
            state.stats.record(idx, batch.correct, G, step)
        drawn.append((batch, scored))
        if not a.dynamic_sampling:
            break
        groups = informative_groups(batch.scores, G).nonzero().flatten()[: P - n_kept]  # (k,)
        if len(groups):
            rows = (groups[:, None] * G + torch.arange(G)).flatten()  # whole groups, contiguous
            kept.append(batch.index(rows))
            kept_parts.append({k: [v[i] for i in rows.tolist()] for k, v in scored.per_fn.items()})
            n_kept += len(groups)
        if n_kept >= P:
            break
    metrics = reward_metrics(drawn, cfg, step, since=state.reward_calls_before)
    metrics.update(partial)
    metrics.update(step_metrics([(b.step_rewards, b.step_mask) for b, _ in drawn if b.step_mask is not None]))
    metrics.update(hacking.batch_metrics([b.scores for b, _ in drawn], [b.correct for b, _ in drawn], G))
    metrics.update(episode_metrics([e for b, _ in drawn for e in b.episodes]))
    metrics.update(role_metrics([b for b, _ in drawn], cfg.roles.names))
    if state.stats is not None:  # read here, as the batch is collected (one step off: in the rollout's thread)
        metrics.update(state.stats.metrics())
        # the training prompts' groups scored so far, in passes over the data
        metrics["epoch"] = float(state.stats.count.sum()) / (G * max(state.stats.n, 1))
    if a.dynamic_sampling:
        metrics.update({"dynamic_sampling/rounds": float(len(drawn)),
                        "dynamic_sampling/groups_drawn": float(len(drawn) * P),
                        "dynamic_sampling/groups_kept": float(n_kept)})
    batch = cat_batches(kept) if kept else drawn[-1][0]
    state.reward_errors = first_errors([s for _, s in drawn])
    lost = next((e["error"] for b, _ in drawn for e in b.episodes if e["error"] is not None), None)
    if lost is not None:  # the environment's first failure, for the stop on lost trajectories (health.ENV)
        state.reward_errors[ENV] = lost
    state.reward_parts = ({k: [v for p in kept_parts for v in p[k]] for k in kept_parts[0]} if kept
                          else drawn[-1][1].per_fn)
    return batch, metrics


def _rollout_share(state: RLState, cfg: Config, idx: list[int], t: dict[str, float],
                   step: int) -> tuple[Batch, ScoreResult]:
    """Generate and score the groups of prompts ``idx`` in this process."""
    examples = [state.examples[i] for i in idx]
    prompts = [state.prompts[i] for i in idx]
    with _timed(t, "rollout"), autocast(state.policy, cfg.model.autocast):
        if cfg.env.multi_turn:  # trajectories: the policy's turns and the environment's answers, token-exact
            batch, _ = rollout_env(state.policy, state.tokenizer, examples, prompts, cfg, group_size=cfg.algo.group_size)
        else:
            batch = generate(state.policy, state.tokenizer, prompts, group_size=cfg.algo.group_size,
                             replay=cfg.rollout.replays, **sampling_args(cfg.rollout))
    return batch, _scored(state, cfg, batch, examples, t, step)


def _partial_share(state: RLState, cfg: Config, t: dict[str, float], step: int) -> tuple[list[int], Batch,
                                                                                           ScoreResult, dict[str, float]]:
    """rollout.partial_tokens: one budget of tokens for every group in flight (``rlft.rollout.partial``) before RL
    step ``step``; the finished groups' prompt indices, their batch and scores, and the partial/ metrics."""
    args = sampling_args(cfg.rollout)
    args.pop("max_new_tokens")
    run = turn_sampler(state.policy, state.tokenizer, replay=cfg.rollout.replays, **args)
    was_training = state.policy.training
    with _timed(t, "rollout"), autocast(state.policy, cfg.model.autocast), torch.no_grad():
        state.policy.eval()
        try:
            done = state.partial.collect(run, state.prompts, lambda k: state.sampler.take(k, step),
                                         cfg.train.prompts_per_step, state.step)
        finally:
            state.policy.train(was_training)
        batch = finished_batch(done, state.prompts, state.tokenizer, state.step)
    idx = [g.index for g in done]
    scored = _scored(state, cfg, batch, [state.examples[i] for i in idx], t, step)
    return idx, batch, scored, partial_metrics(done, len(state.partial.pending), state.step)


def _scored(state: RLState, cfg: Config, batch: Batch, examples: Sequence[Example], t: dict[str, float],
            step: int) -> ScoreResult:
    """Score the groups of ``batch`` (one example per group) with RL step ``step``'s reward weights and record the
    rule's verdicts in ``batch.correct``."""
    with _timed(t, "reward"):
        scored = score(batch, examples, cfg, step=step)
        attach_steps(batch, scored, state.tokenizer, cfg, step=step)
    with _timed(t, "rule_check"):  # the evaluation's rule on each rollout: reward-hacking metrics, RM refresh
        batch.correct = hacking.rule_correct(batch.texts, examples, cfg.algo.group_size, cfg, scored)
    return scored


def merge_scores(parts: Sequence[ScoreResult]) -> ScoreResult:
    """The ``ScoreResult`` of consecutive batches scored apart (the processes' shares, in rank order)."""
    names = list(parts[0].per_fn)
    steps = {name: [x for p in parts for x in p.steps.get(name, [])] for name in parts[0].steps}
    first: dict[str, tuple[int, str]] = {}
    offset = 0
    for p in parts:  # each reward's first failure, its sample numbered in the whole batch
        for name, (i, text) in p.first_errors.items():
            first.setdefault(name, (offset + i, text))
        offset += len(p.total)
    return ScoreResult(total=[x for p in parts for x in p.total],
                       per_fn={n: [x for p in parts for x in p.per_fn[n]] for n in names},
                       errors={n: sum(p.errors.get(n, 0) for p in parts) for n in {k for p in parts for k in p.errors}},
                       steps=steps, first_errors=first)


def first_errors(parts: Sequence[ScoreResult]) -> dict[str, str]:
    """Each reward's first failure over the rounds ``parts`` of a step, as "sample <i>: <Type>: <message>"."""
    out: dict[str, str] = {}
    for p in parts:
        for name, (i, text) in p.first_errors.items():
            out.setdefault(name, f"sample {i}: {text}")
    return out


def score(batch: Batch, examples: Sequence[Example], cfg: Config, step: int = 1) -> ScoreResult:
    """Sets ``batch.scores`` (B,): the weighted reward (the weights of RL step ``step``, ``reward.weights_at``), plus
    the soft overlong punishment when enabled."""
    G = batch.group_size
    lengths = batch.response_lengths.tolist()  # (B,) response tokens, for length-shaping rewards
    means = batch.mean_rollout_logp  # (B,) the sampler's mean log-prob per sequence (cor_reward's confidence), or None
    conf = [None] * len(batch) if means is None else [None if math.isnan(v) else v for v in means.tolist()]
    samples = [{**ex.to_mapping(), "num_tokens": lengths[i * G + j], "mean_logp": conf[i * G + j]}
               for i, ex in enumerate(examples) for j in range(G)]
    for sample, episode in zip(samples, batch.episodes):  # multi-turn: the environment's own verdicts
        sample.update(env_reward=episode["env_reward"], env_turn_rewards=episode["turn_rewards"],
                      env_truncated=episode["truncated"])
    scored = score_batch(batch.texts, samples, built(cfg.reward), cfg.reward.weights_at(step),
                         timeout_s=cfg.reward.timeout_s, group_size=G)
    lost = [bool(e["error"]) for e in batch.episodes] or [False] * len(batch)  # the environment failed them
    scores = torch.tensor([math.nan if s is None or bad else s for s, bad in zip(scored.total, lost)])  # (B,)
    if batch.roles is not None:  # several roles: each its own reward; the batch's score is the first role's
        batch.role_scores = score_roles(batch, scores, samples, cfg, step=step)  # (B, R)
        scores = batch.role_scores[:, 0].clone()
    a = cfg.algo
    if a.overlong_buffer_frac > 0:
        L = cfg.rollout.max_new_tokens
        cache = max(1, round(a.overlong_buffer_frac * L))
        penalty = soft_overlong_penalty(batch.response_lengths, L, cache, a.overlong_penalty)  # (B,) DAPO eq. 13
        scores = scores + penalty
        scored.per_fn["overlong_penalty"] = penalty.tolist()
        if batch.role_scores is not None:
            batch.role_scores[:, 0] = scores
    batch.scores = scores
    batch.reward_parts = torch.tensor([[math.nan if v is None else v for v in vals] for vals in scored.per_fn.values()],
                                      dtype=torch.float32).T.reshape(len(batch), -1)  # (B, K)
    return scored


def reward_part_weights(cfg: Config, step: int = 1) -> tuple[float, ...]:
    """The weight of each column of ``Batch.reward_parts``: reward.fns' weights, then 1.0 for the overlong penalty."""
    return (*cfg.reward.weights_at(step), *((1.0,) if cfg.algo.overlong_buffer_frac > 0 else ()))


def attach_steps(batch: Batch, scored: ScoreResult, tokenizer, cfg: Config, step: int = 1) -> None:
    """Sets ``batch.step_rewards`` and ``batch.step_mask`` (B, T) from the step-level rewards, when there are any."""
    if scored.steps:
        weights = dict(zip(cfg.reward.keys, cfg.reward.weights_at(step)))
        batch.step_rewards, batch.step_mask = step_tensors(tokenizer, batch.response_ids, batch.response_mask,
                                                           scored.steps, weights)


def reward_metrics(drawn: list[tuple[Batch, ScoreResult]], cfg: Config, step: int = 1,
                   since: int = 0) -> dict[str, float]:
    """The step's reward metrics over every sample drawn: ``reward/mean``, ``reward/std`` (over the batch),
    ``reward/group_std`` (the mean over groups of the within-group std), ``reward/<name>/mean``, ``/errors``,
    ``/failed_frac`` (the share of the step's samples it failed on), ``reward/<name>/weight`` (each reward.fns entry's
    weight at RL step ``step``, its schedule applied), ``reward/samples`` (the samples scored) and
    ``reward/calls_left_running`` (this run's timed-out calls still running in their threads: those given up
    after the first ``since`` of the process, ``rlft.rewards.calls``)."""
    scores = torch.cat([b.scores for b, _ in drawn])
    valid = ~torch.isnan(scores)
    vals = scores[valid]
    _, group_std, zero_std = group_stats(scores, cfg.algo.group_size)
    lengths = torch.cat([b.response_lengths for b, _ in drawn]).float()
    truncated = torch.cat([b.truncated for b, _ in drawn])
    out = {
        "reward/mean": vals.mean().item() if vals.numel() else 0.0,
        "reward/std": vals.std().item() if vals.numel() > 1 else 0.0,
        "reward/unscorable_frac": 1.0 - valid.float().mean().item(),
        "frac_reward_zero_std": zero_std.float().mean().item(),
        "reward/group_std": group_std.mean().item(),  # TRL's reward_std: a group with < 2 valid rewards counts 0
        "reward/samples": float(len(scores)),
        "reward/calls_left_running": float(left_running(since)),
        "response_length/mean": lengths.mean().item(),
        "response_length/max": lengths.max().item(),
        "response_length/clip_ratio": truncated.float().mean().item(),
    }
    for name in drawn[0][1].per_fn:
        ok = [v for _, s in drawn for v in s.per_fn[name] if v is not None]
        out[f"reward/{name}/mean"] = sum(ok) / len(ok) if ok else 0.0
        if name in cfg.reward.keys:
            out[f"reward/{name}/errors"] = float(sum(s.errors.get(name, 0) for _, s in drawn))
            out[f"reward/{name}/failed_frac"] = out[f"reward/{name}/errors"] / max(len(scores), 1)
    for name, weight in zip(cfg.reward.keys, cfg.reward.weights_at(step)):  # the step's weights, schedules applied
        out[f"reward/{name}/weight"] = weight
    names = list(drawn[0][1].per_fn)  # reward.fns' keys, then overlong_penalty when it is on
    weights = {**dict(zip(cfg.reward.keys, cfg.reward.weights_at(step))), "overlong_penalty": 1.0}
    rows = [[math.nan if v is None else float(v) for v in row] for _, s in drawn
            for row in zip(*(s.per_fn[n] for n in names))]
    parts = torch.tensor(rows, dtype=torch.float32) if names else torch.zeros(len(scores), 0)  # (B, K) NaN: unscorable
    out.update(trl_names.reward_metrics(parts, [weights.get(n, 1.0) for n in names], names,
                                        cfg.algo.group_size))  # TRL's names: reward, reward_std, rewards/<name>/*
    out.update(trl_names.completion_metrics(lengths, truncated))
    return out


# --------------------------------------------------------------------------- log-probs, values, advantages


@torch.no_grad()
def fill_logprobs(state: RLState, batch: Batch, cfg: Config) -> dict[str, float]:
    """Old log-probs (only when not single pass, or when teachers need the student's), reference log-probs (only
    with a KL term), values (critic), the teachers' log-probs (the distill stage; their weighted mean in
    ``batch.teacher_logp``, each through the same chunked, shared-prefix path as the reference). Returns the distill
    metrics (none without teachers).

    The old log-probs are those the sampler computed while sampling when the sampler is exact
    (``rlft.rollout.hf.samples_exactly``: the trainer's own model in float32 without autocast): the same policy and
    temperature, so a forward pass over the batch is saved, unless the batch is stale (``Batch.staleness``: sampled
    with the weights before an earlier update, ``train.async_rollout``). Any other sampler's log-probs stay in
    ``batch.rollout_logp``, for the rollout correction against the trainer's recomputed ones."""
    a = cfg.algo

    def logprobs_of(model, replay: bool = True) -> tuple:
        return model, lambda mb: batch_logprobs(model, mb, cfg, replay=replay)[0], shares_prefix(model, cfg)

    models = {}  # name: (the model, the forward of a micro-batch, whether it computes each group's prompt once)
    needs_old = not a.single_pass or bool(state.teachers)  # the distill signal compares the student's at rollout
    replayed = batch.rollout_kept is not None or not cfg.rollout.truncates  # the sampler's log-probs are the trainer's
    if needs_old and batch.rollout_logp is not None and samples_exactly(cfg) and replayed and not batch.staleness:
        batch.old_logp = batch.rollout_logp * batch.response_mask
    elif needs_old:
        models["old_logp"] = logprobs_of(state.policy)
    if a.needs_ref:
        models["ref_logp"] = logprobs_of(state.ref)
    for k, teacher in enumerate(state.teachers):  # frozen, as the reference
        models[f"teacher_{k}"] = logprobs_of(teacher, replay=False)  # a teacher's whole distribution
    if state.critic is not None:
        def values(mb: Batch) -> torch.Tensor:
            with autocast(state.critic, cfg.model.autocast):
                return state.critic.values(mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask).float()

        models["values"] = state.critic, values, False
    own = batch.index(state.dist.share(len(batch)))  # this process's rows; the others compute theirs
    teachers = []  # (B, T) each, in distill.teachers order
    for name, (model, fn, shared) in models.items():
        out = torch.zeros(own.response_ids.shape)  # (b, T)
        with strategy().gathered(model):  # sharded: whole for this pass, then split again before the next model's
            for rows, mb in micro_batches(own, cfg.train.micro_batch_size, cfg.train.micro_batch_tokens, shared):
                out[rows, :mb.response_ids.shape[1]] = fn(mb).cpu()  # (rows, t <= T): trimmed columns stay 0
        if name.startswith("teacher_"):
            teachers.append(torch.cat(state.dist.gather(out)))
        else:
            setattr(batch, name, torch.cat(state.dist.gather(out)))
    return distill_logprobs(batch, teachers, cfg) if teachers else {}


def compute_advantages(state: RLState, batch: Batch, cfg: Config) -> dict[str, float]:
    """Sets ``batch.adv``, ``batch.ret`` and ``batch.loss_mask``; returns KL-in-reward and critic metrics."""
    a = cfg.algo
    mask = batch.action_mask  # (B, T) the policy's tokens: an environment's carry no advantage, loss or KL
    metrics: dict[str, float] = {}
    token_rewards = None
    if a.kl_in == "reward" and a.needs_ref:  # PPO-RLHF: r_t = -beta * kl_t (Ouyang et al. 2022 eq. 2)
        coef = state.kl_ctl.value
        kl_tok = -kl_penalty_rewards(batch.old_logp, batch.ref_logp, mask, 1.0, a.kl_estimator)  # (B, T) kl_t, 0 masked
        token_rewards = -coef * kl_tok  # (B, T)
        metrics["actor/reward_kl_penalty"] = masked_mean(kl_tok, mask).item()
        metrics["actor/reward_kl_penalty_coeff"] = coef
        metrics["actor/kl_seq"] = kl_tok.sum(-1).mean().item()  # KL per sequence: what the controller tracks
    baseline = None
    if a.advantage == "reinforce" and a.baseline == "ema":
        current = mean_return(AdvantageInputs(batch.scores, mask, a.group_size, token_rewards), a.gamma)
        baseline = state.baseline if state.baseline is not None else current  # first batch: its own mean
        state.baseline = ema_update(state.baseline, current, a.baseline_momentum)
    inp = AdvantageInputs(batch.scores, mask, a.group_size, token_rewards=token_rewards, values=batch.values,
                          baseline=baseline, step_rewards=batch.step_rewards, step_mask=batch.step_mask,
                          reward_parts=batch.reward_parts, reward_weights=reward_part_weights(cfg, state.step + 1))
    estimate = ADVANTAGES.get(a.advantage)
    if batch.role_scores is not None and a.advantage == "gdpo":
        raise ConfigError("algo.advantage: 'gdpo' normalises the reward components of one policy; with several roles "
                          "each role has its own reward (use group_norm)")
    if batch.role_scores is None:
        batch.adv, batch.ret = estimate(inp, a)  # (B, T) each
    else:  # several roles: each role's advantage from its own reward, on its own tokens
        batch.adv, batch.ret = role_advantages(lambda x: estimate(x, a), inp, batch)
    if batch.teacher_logp is not None:  # the distill stage: the reverse-KL signal, the task's advantage weighted
        metrics.update(distill_advantages(batch, mask, cfg))
    batch.loss_mask = overlong_filter(mask, batch.truncated) if a.overlong_filter else mask  # DAPO §3.4
    if batch.values is not None:
        metrics.update({"critic/values/mean": masked_mean(batch.values, mask).item(),
                        "critic/returns/mean": masked_mean(batch.ret, mask).item(),
                        "critic/vf_explained_var": explained_variance(batch.values, batch.ret, mask).item()})
    if a.overlong_filter:
        metrics["actor/overlong_filtered_frac"] = batch.truncated.float().mean().item()
    return metrics
