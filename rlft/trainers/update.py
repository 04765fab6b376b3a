"""The update phase: ``algo.epochs`` passes of ``algo.minibatches`` optimizer steps of the policy and the critic.

Micro-batches accumulate gradients of exactly the mini-batch's loss: each
aggregation's denominator is computed over the whole mini-batch first, then every
micro-batch back-propagates its numerator over that total (see ``rlft.core.losses``).
With several processes (``rlft.parallel.dist``) each takes its share of every mini-batch's
rows; their gradients and their additive metrics are summed before the step.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Iterator

import torch
from torch import Tensor

from rlft.config import Config
from rlft.core.distill import reverse_kl_loss
from rlft.core.kl import KL_ESTIMATORS, k3
from rlft.core.losses import POLICY_LOSSES, aggregate_parts, aggregation_weight, positive_lm_parts, top_entropy_mask
from rlft.core.rollout_corr import correction_weights, gap_metrics, gap_stats, resolve
from rlft.core.ops import masked_mean, masked_sum
from rlft.core.value import value_loss
from rlft.parallel.launch import strategy
from rlft.parallel.strategy import idle_loss
from rlft.models.forward import autocast, response_logprobs
from rlft.models.roles import by_role, has_roles
from rlft.rollout.batch import Batch
from rlft.rollout.hf import samples_exactly
from rlft.runs import stop
from rlft.trainers.ptx import lm_loss_sum, lm_tokens

if TYPE_CHECKING:
    from rlft.trainers.state import RLState


def micro_batches(batch: Batch, size: int, max_tokens: int = 0, shared: bool = False
                  ) -> Iterator[tuple[Tensor, Batch]]:
    """``(rows, micro-batch)`` pairs that cover ``batch`` once: at most ``size`` rows each and, with ``max_tokens``
    > 0, at most that many tokens. Each micro-batch is trimmed to its own widths (``Batch.trimmed``).

    Without a budget the micro-batches are consecutive rows. With one, runs of rows that share a prompt (groups)
    are ordered by their padded length and packed whole while they fit, so that short responses are not padded to
    the longest and the shared-prefix forward still sees whole groups; a group over the budget alone is cut into
    rows. The tokens counted are those the forward computes: rows x (prompt width + response width), or with
    ``shared`` (a forward that computes each group's prompt once and each response in runs of similar length,
    ``rlft.models.forward``) groups x prompt width + the responses' own lengths."""
    n = len(batch)
    if not max_tokens:
        chunks = [torch.arange(s, min(s + size, n)) for s in range(0, n, size)]
    else:
        chunks = _packed(batch, size, max_tokens, shared)
    for rows in chunks:
        yield rows, batch.index(rows).trimmed()


def _packed(batch: Batch, size: int, max_tokens: int, shared: bool) -> list[Tensor]:
    """Row indices of the token-budget micro-batches of ``batch`` (see ``micro_batches``)."""
    from rlft.models.forward import prompt_groups

    if not len(batch):
        return []
    p_len, r_len = batch.prompt_mask.sum(1), batch.response_mask.sum(1).clamp(min=1)  # (B,) each
    _, run = prompt_groups(batch.prompt_ids, batch.prompt_mask)  # (B,) index of each row's run of one prompt
    units = [(run == u).nonzero().squeeze(1) for u in range(int(run.max()) + 1)]
    shared = shared and any(len(u) > 1 for u in units)  # distinct prompts only: the forward is the plain one

    def tokens(n_units: int, rows: int, tp: int, t: int, responses: int) -> int:  # what a micro-batch computes
        return n_units * tp + responses if shared else rows * (tp + t)

    whole = batch.trimmed()
    if len(batch) <= size and tokens(len(units), len(batch), whole.prompt_ids.shape[1], whole.response_ids.shape[1],
                                     int(r_len.sum())) <= max_tokens:
        return [torch.arange(len(batch))]  # it all fits: one micro-batch, rows in batch order
    units.sort(key=lambda r: (int(p_len[r].max() + r_len[r].max()), int(r[0])))
    chunks: list[Tensor] = []
    cur: list[Tensor] = []
    tp = t = rows = resp = 0
    for unit in units:
        u_tp, u_t, u_resp = int(p_len[unit].max()), int(r_len[unit].max()), int(r_len[unit].sum())
        w_tp, w_t = max(tp, u_tp), max(t, u_t)
        if cur and (rows + len(unit) > size or tokens(len(cur) + 1, rows + len(unit), w_tp, w_t,
                                                       resp + u_resp) > max_tokens):
            chunks.append(torch.cat(cur))
            cur, tp, t, rows, resp = [], 0, 0, 0, 0
            w_tp, w_t = u_tp, u_t
        if len(unit) > size or tokens(1, len(unit), w_tp, w_t, u_resp) > max_tokens:  # alone over: cut into rows
            per = max(1, min(size, (max_tokens - w_tp) // w_t if shared else max_tokens // (w_tp + w_t)))
            chunks += list(unit.split(per))
            continue
        cur.append(unit)
        tp, t, rows, resp = w_tp, w_t, rows + len(unit), resp + u_resp
    if cur:
        chunks.append(torch.cat(cur))
    return chunks


def shares_prefix(model, cfg: Config) -> bool:
    """Whether ``batch_logprobs`` of ``model`` computes each group's prompt once (``micro_batches``' ``shared``)."""
    from rlft.models.forward import can_share_prefix

    return cfg.train.shared_prefix and can_share_prefix(model)


def batch_logprobs(model, mb: Batch, cfg: Config, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``response_logprobs`` of ``mb``'s responses under ``model`` at the rollout temperature (under
    ``model.autocast``; log-softmax runs in float32 there, so the log-probs are float32), ``train.logprob_chunk``
    response tokens at a time without the full logits where the model allows it; renormalised over each token's
    kept set (``mb.rollout_kept``) when the run replays the sampling support (``rollout.replays``), unless
    ``replay=False`` (a teacher's log-probs, which are its whole distribution's). A batch that several
    roles wrote, on a model with roles: each token's under its own role's adapter (``rlft.models.roles.by_role``)."""
    if mb.roles is not None and has_roles(model):
        return by_role(model, mb.roles, lambda rows: _logprobs(model, mb.index(rows), cfg, **kwargs))
    return _logprobs(model, mb, cfg, **kwargs)


def _logprobs(model, mb: Batch, cfg: Config, *, replay: bool = True, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    kept = mb.rollout_kept if replay and cfg.rollout.replays else None  # over the sampler's kept sets (rlft.core.support)
    with autocast(model, cfg.model.autocast):
        return response_logprobs(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
                                 temperature=cfg.rollout.temperature, shared_prefix=cfg.train.shared_prefix,
                                 chunk=cfg.train.logprob_chunk, kept=kept, **kwargs)


def rollout_correction(cfg: Config, stale: bool = False) -> str:
    """The run's ``algo.rollout_correction`` with ``auto`` resolved by its sampler (``rlft.rollout.hf.samples_exactly``)
    and the batch: a ``stale`` batch (sampled before an earlier update, ``train.async_rollout``) is corrected whatever
    the sampler, its sampler's weights being older than pi_old."""
    return resolve(cfg.algo.rollout_correction, samples_exactly(cfg) and not stale)


def corrected(pg_mat: Tensor, old_logp: Tensor, micro: Batch, mask: Tensor, mode: str, a) -> tuple[Tensor, dict]:
    """(pg_mat * w, gap_stats): each token's policy-gradient loss times the detached rollout-correction weight w of
    ``mode`` (``rlft.core.rollout_corr``: pi_old / pi_sampler, truncated or masked), and the micro-batch's parts of the
    rollout_corr/ metrics; the loss unchanged and no parts without the sampler's log-probs (``off`` only)."""
    if micro.rollout_logp is None:
        if mode != "off":
            raise RuntimeError(f"algo.rollout_correction={mode} needs the sampler's log-probs (Batch.rollout_logp), "
                               "and the rollout returned none for this batch; set algo.rollout_correction=off")
        return pg_mat, {}
    rollout_logp = micro.rollout_logp.to(pg_mat.device)
    w, rejected = correction_weights(old_logp, rollout_logp, mask, mode, a.rollout_corr_cap, a.rollout_corr_low)
    return pg_mat * w, gap_stats(old_logp, rollout_logp, mask, mode, rejected)


def update(state: "RLState", batch: Batch, cfg: Config, *, train_policy: bool = True) -> dict[str, float]:
    """Run the optimizer steps over ``batch``; returns metrics averaged over them, except a maximum (a key ending
    in ``_max``), which is the largest over them.

    With ``algo.target_kl`` > 0, a mini-batch whose KL(pi_old || pi) exceeds 1.5 * target_kl (measured in its own
    forward, before its step, ``_policy_step``) is not stepped, and the update ends there: no later mini-batch or
    epoch trains the policy or the critic. Its measurements still count in the averages (Stable-Baselines3 logs them
    too); the learning-rate schedules advance past the skipped steps, so they stay a function of the RL step.
    ``actor/early_stopped`` (1.0 or 0.0) and ``actor/minibatch_updates`` (policy steps taken) say what happened."""
    a = cfg.algo
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    peaks: dict[str, float] = {}
    gen = torch.Generator().manual_seed(cfg.train.seed * 100003 + state.step)
    n_chunks = len(torch.arange(len(batch)).chunk(a.minibatches))
    done, stopped = 0, False
    for _ in range(a.epochs):
        order = torch.randperm(len(batch), generator=gen) if a.minibatches > 1 else torch.arange(len(batch))
        for mb_idx in order.chunk(a.minibatches):
            stop.check_update(cfg.train.stop_grace_s)  # a stop signal: the update goes on for its grace at most
            mb = batch.index(mb_idx)
            metrics = _policy_step(state, mb, cfg) if train_policy else {}
            stopped = metrics.pop("actor/early_stopped", 0.0) > 0
            if state.critic is not None and not stopped:
                metrics.update(_critic_step(state, mb, cfg))
            for k, v in metrics.items():
                if k.endswith("_max"):
                    peaks[k] = max(peaks.get(k, v), v)
                else:
                    sums[k], counts[k] = sums.get(k, 0.0) + v, counts.get(k, 0) + 1
            if stopped:
                break
            done += 1
        if stopped:
            break
    out = {**{k: v / counts[k] for k, v in sums.items()}, **peaks}
    if a.target_kl > 0 and train_policy:
        for _ in range(a.epochs * n_chunks - done):  # the steps not taken: the schedules move on as planned
            state.scheduler.step()
            if state.critic is not None:
                state.critic_scheduler.step()
        out.update({"actor/early_stopped": float(stopped), "actor/minibatch_updates": float(done)})
    return out


def early_stop(approx_kl: float, target_kl: float) -> bool:
    """Whether an update stops before a mini-batch whose mean k3 estimate of KL(pi_old || pi) is ``approx_kl``:
    above 1.5 * ``target_kl`` (Stable-Baselines3's PPO, ``ppo.py``: ``approx_kl_div > 1.5 * self.target_kl``,
    checked per mini-batch before its optimizer step); never when ``target_kl`` is 0 (off)."""
    return target_kl > 0 and approx_kl > 1.5 * target_kl


def _loss_mask(mb: Batch) -> torch.Tensor:
    return (mb.loss_mask if mb.loss_mask is not None else mb.action_mask).float()


def _policy_step(state: "RLState", mb: Batch, cfg: Config) -> dict[str, float]:
    """One policy optimizer step on mini-batch ``mb``."""
    a = cfg.algo
    policy = state.policy
    device = next(policy.parameters()).device
    max_len = cfg.rollout.max_new_tokens
    full_mask = _loss_mask(mb)
    # normalisers of the whole mini-batch (clamped: a mini-batch without valid tokens contributes a zero loss)
    total_den = aggregation_weight(full_mask, a.loss_agg, max_len).clamp(min=1e-8)
    positive = _positive(mb, a.lm_threshold)
    lm_den = (full_mask * positive[:, None]).sum().clamp(min=1.0)
    kl_coef = state.kl_ctl.value if state.kl_ctl is not None else 0.0
    # the policy loss sees the algo config as it holds at this step: a copy carrying the adaptive PPO-penalty beta
    # (PPO §4), which is trainer state (RLState.penalty_ctl); cfg itself is never mutated
    loss_cfg = replace(a, penalty_coef=state.penalty_ctl.value) if state.penalty_ctl is not None else a
    totals: dict[str, float] = {}
    n_tok = full_mask.sum().item()
    dist, s = state.dist, strategy()
    model = s.runner(policy)  # what the update's passes call (a DeepSpeed engine, say)
    # a model whose every forward call is a collective (sharded weights gathered layer by layer): every process
    # must make the same calls, so the shared-prefix forward makes as many calls for runs of similar response
    # lengths as the process with the most (agreed in each pass), a number that would otherwise differ
    agree = s.agreed(policy)
    correction, gaps = rollout_correction(cfg, stale=mb.staleness > 0), []
    micros = [m for _, m in micro_batches(mb.index(dist.share(len(mb))), cfg.train.micro_batch_size,
                                          cfg.train.micro_batch_tokens, shares_prefix(policy, cfg))]
    for _ in range(s.lockstep(policy, len(micros))):  # every process runs as many passes as the busiest
        s.backward(policy, idle_loss(batch_logprobs(model, mb.index(slice(0, 1)), cfg, agree=agree)[0].sum()))
    for micro in micros:
        stop.check_update(cfg.train.stop_grace_s)
        mask = _loss_mask(micro).to(device)  # (b, T)
        logp, ent = batch_logprobs(model, micro, cfg, with_entropy=True, entropy_grad=a.entropy_coef > 0,
                                   agree=agree)
        old_logp = logp.detach() if a.single_pass else micro.old_logp.to(device)
        pg_mat, pg_metrics = POLICY_LOSSES.get(a.policy_loss)(logp, old_logp, micro.adv.to(device), mask,
                                                          loss_cfg)
        pg_mat, gap = corrected(pg_mat, old_logp, micro, mask, correction, a)
        gaps += [gap] if gap else []
        if a.entropy_top_frac < 1:  # "Beyond the 80/20 rule": only the highest-entropy tokens' policy gradient
            top = top_entropy_mask(ent, mask, a.entropy_top_frac)  # (b, T), this micro-batch's tokens
            pg_mat = torch.where(top, pg_mat, torch.zeros_like(pg_mat))
            kept = masked_mean(top.float(), mask).item() * share_of(mask, n_tok)
            totals["actor/entropy_top_kept"] = totals.get("actor/entropy_top_kept", 0.0) + kept
        loss_mat = pg_mat
        terms = {"actor/pg_loss": pg_mat}
        if a.needs_ref and a.kl_in == "loss":  # GRPO: beta * KL(pi || ref) in the loss (DeepSeekMath eq. 3-4)
            kl_mat = KL_ESTIMATORS.get(a.kl_estimator)(logp, micro.ref_logp.to(device))  # (b, T)
            loss_mat = loss_mat + kl_coef * kl_mat
            terms["actor/kl_loss"] = kl_mat
            kl_seq = masked_sum(kl_mat.detach(), mask) / len(mb)  # this micro-batch's share of the KL per sequence
            totals["actor/kl_seq"] = totals.get("actor/kl_seq", 0.0) + kl_seq.item()
            ref_kl = masked_mean(k3(logp.detach(), micro.ref_logp.to(device)), mask).item() * share_of(mask, n_tok)
            totals["actor/ref_kl"] = totals.get("actor/ref_kl", 0.0) + ref_kl  # TRL's kl: k3's token mean
        if micro.teacher_logp is not None and cfg.distill.signal == "loss":  # the distill stage's reverse-KL loss
            distill_mat = reverse_kl_loss(logp, micro.teacher_logp.to(device))  # (b, T) value d_t, grad d_t grad logp
            loss_mat = loss_mat + cfg.distill.kl_coef * distill_mat
            terms["distill/kl_loss"] = distill_mat
        if a.entropy_coef > 0:
            loss_mat = loss_mat - a.entropy_coef * ent
        num, _ = aggregate_parts(loss_mat, mask, a.loss_agg, max_len)
        loss = num / total_den
        if a.lm_coef > 0:  # VAPO eq. 9: positive-sample LM loss, a token mean over the correct samples
            lm_num, _ = positive_lm_parts(logp, mask, _positive(micro, a.lm_threshold).to(device))
            loss = loss + a.lm_coef * lm_num / lm_den
            totals["actor/lm_loss"] = totals.get("actor/lm_loss", 0.0) + (lm_num / lm_den).item()
        s.backward(policy, loss)
        totals["actor/loss"] = totals.get("actor/loss", 0.0) + loss.item()  # this micro-batch's part of the loss
        share = mask.sum().item() / max(n_tok, 1)  # token-weighted average of per-micro-batch metrics
        with torch.no_grad():
            if a.target_kl > 0:  # k3 of KL(pi_old || pi), r = pi / pi_old on pi_old's samples: its mini-batch mean
                approx = masked_sum(k3(old_logp, logp.detach()), mask).item() / max(n_tok, 1)
                totals["actor/approx_kl"] = totals.get("actor/approx_kl", 0.0) + approx
            for name, mat in terms.items():
                part = aggregate_parts(mat.detach(), mask, a.loss_agg, max_len)[0] / total_den
                totals[name] = totals.get(name, 0.0) + part.item()
            totals["actor/entropy"] = totals.get("actor/entropy", 0.0) + masked_mean(ent.detach(), mask).item() * share
            for k, v in pg_metrics.items():
                totals[f"actor/{k}"] = totals.get(f"actor/{k}", 0.0) + float(v) * share
    if a.ptx_coef > 0:  # PPO-ptx (InstructGPT eq. 2): gamma * pretraining NLL
        ids, mask, weights = state.ptx.sample()  # the same batch in every process (the same seeded generator)
        rows = dist.share(len(ids))  # each process its rows, over the whole batch's token count
        if len(ids[rows]):
            ptx = lm_loss_sum(model, ids[rows], mask[rows], weights[rows], chunk=cfg.train.logprob_chunk) / \
                lm_tokens(mask, weights)
            s.backward(policy, a.ptx_coef * ptx)
            totals["actor/ptx_loss"] = ptx.item()
            totals["actor/loss"] = totals.get("actor/loss", 0.0) + a.ptx_coef * ptx.item()
        elif s.shards(policy):  # no rows here: the sharded model still runs the pass the others run
            s.backward(policy, idle_loss(lm_loss_sum(model, ids[:1], mask[:1], weights[:1],
                                                     chunk=cfg.train.logprob_chunk)))
    totals = dist.sum_floats(totals)  # each process's share of the mini-batch's loss terms
    totals.update(gap_metrics([g for part in dist.gather(gaps) for g in part]))
    if a.needs_ref and a.kl_in == "loss":
        totals["actor/kl_coef"] = kl_coef
    if state.penalty_ctl is not None:
        totals["actor/ppo_penalty_coef"] = loss_cfg.penalty_coef
    totals["actor/positive_frac"] = positive.float().mean().item()
    if early_stop(totals.get("actor/approx_kl", 0.0), a.target_kl):  # the same sum in every process: all stop
        s.discard(policy, state.optimizer)  # this mini-batch's gradients, never applied
        totals["actor/early_stopped"] = 1.0
        return totals
    totals.update(_optimizer_step(policy, state.optimizer, state.scheduler, cfg.optim.grad_clip, "actor"))
    return totals


def share_of(mask: torch.Tensor, n_tok: float) -> float:
    """This micro-batch's share of the mini-batch's valid tokens (the weight of its token-averaged metrics)."""
    return mask.sum().item() / max(n_tok, 1)


def _positive(mb: Batch, threshold: float) -> torch.Tensor:
    """(b,) float: 1 where the sample's total reward is at least ``threshold`` (NaN: not positive)."""
    scores = torch.nan_to_num(mb.scores, nan=-torch.inf)
    return (scores >= threshold).float()


def _critic_step(state: "RLState", mb: Batch, cfg: Config) -> dict[str, float]:
    """One critic optimizer step: clipped value loss, token mean over the mini-batch."""
    critic, dist, s = state.critic, state.dist, strategy()
    device = next(critic.parameters()).device
    total = _loss_mask(mb).sum().clamp(min=1.0)
    totals = {"critic/vf_loss": 0.0, "critic/vf_clipfrac": 0.0}
    micros = [m for _, m in micro_batches(mb.index(dist.share(len(mb))), cfg.train.micro_batch_size,
                                          cfg.train.micro_batch_tokens)]
    model = s.runner(critic)
    for _ in range(s.lockstep(critic, len(micros))):  # every process runs as many passes as the busiest
        one = mb.index(slice(0, 1))
        s.backward(critic, idle_loss(model(one.prompt_ids, one.prompt_mask, one.response_ids,
                                           one.response_mask).sum()))
    for micro in micros:
        mask = _loss_mask(micro).to(device)
        with autocast(critic, cfg.model.autocast):  # V(s_t) (critic.values)
            values = model(micro.prompt_ids, micro.prompt_mask, micro.response_ids, micro.response_mask)
        values = values.float()
        loss_mat, m = value_loss(values, micro.values.to(device), micro.ret.to(device), mask, cfg.algo.vf_clip)
        loss = masked_sum(loss_mat, mask) / total
        s.backward(critic, loss)
        totals["critic/vf_loss"] += loss.item()
        totals["critic/vf_clipfrac"] += float(m["vf_clipfrac"]) * mask.sum().item() / total.item()
    totals = state.dist.sum_floats(totals)
    totals.update(_optimizer_step(critic, state.critic_optimizer, state.critic_scheduler, cfg.critic.grad_clip,
                                  "critic"))
    return totals


def _optimizer_step(model, optimizer, scheduler, grad_clip: float, prefix: str) -> dict[str, float]:
    """The strategy's step (gradients summed over the processes, clipped, applied unless their norm is not finite),
    then the schedule advances."""
    lr = scheduler.get_last_lr()[0]
    grad_norm = strategy().step(model, optimizer, grad_clip)
    scheduler.step()
    return {f"{prefix}/lr": lr, f"{prefix}/grad_norm": grad_norm,
            f"{prefix}/skipped_steps": float(not math.isfinite(grad_norm))}
