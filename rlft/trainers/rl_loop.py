"""The RL loop of a run: RL steps until ``train.steps`` (or the time budget), with validation, sample logs, health
warnings, checkpoints, and a clean stop on SIGINT/SIGTERM or on too many skipped updates."""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path

from rlft.config import Config, ConfigError
from rlft.errors import TrainingHalted
from rlft.insight.eval import HeldOut, evaluate_sets, val_metrics
from rlft.insight.health import ENV
from rlft.parallel.dist import current
from rlft.parallel.launch import strategy
from rlft.runs import checkpoint, stop
from rlft.runs.start import append_jsonl, seed_everything, write_json
from rlft.runs.tracking import MetricsLog
from rlft.rollout.partial import PartialRollouts
from rlft.trainers.async_rollout import AsyncRollouts
from rlft.trainers.state import RLState
from rlft.trainers.rl import rl_step, sample_records
from rlft.trainers.rl_setup import PROCESS_SEED_STRIDE, build_rl_state, restore, save_checkpoint
from rlft.trainers.rm_refresh import RUN_RM


def run_rl(policy, tokenizer, train_ex, train_prompts, cfg: Config, run_dir: Path, ckpt, echo,
            held_out: list[HeldOut], teachers=()) -> None:
    """RL of ``policy`` in ``run_dir`` (from ``ckpt`` when resuming); ``teachers``: the distill stage's."""
    t0 = time.perf_counter()
    dist = current()
    state = build_rl_state(policy, tokenizer, train_ex, train_prompts, cfg, teachers)
    state.dist = dist
    if cfg.train.overlapped:  # one-step-off rollouts: the sampler copy, before a checkpoint fills the one in flight
        state.rollouts = AsyncRollouts(state, cfg)
    if cfg.rollout.partial_tokens:  # the groups in flight between steps, before a checkpoint fills them
        if dist.active:
            raise ConfigError(f"rollout.partial_tokens: partial rollouts run in one process; run without accelerate "
                              f"launch / torchrun ({dist.world} processes) or set rollout.partial_tokens=0")
        state.partial = PartialRollouts(cfg.rollout.partial_tokens, cfg.rollout.max_new_tokens, cfg.algo.group_size)
    if ckpt is not None:
        restore(state, ckpt, run_dir, echo, cfg)
    else:
        if dist.rank:  # each process samples its own share of the groups: its own random stream
            seed_everything(cfg.train.seed + PROCESS_SEED_STRIDE * dist.rank)
        if state.critic is not None and cfg.critic.pretrain_steps:
            pretrain_critic(state, cfg, run_dir)
    log = MetricsLog(run_dir) if dist.is_main else None
    bar = progress_bar(cfg.train.steps, "rl", cfg, initial=state.step)
    policy.train()
    try:
        budget = cfg.train.time_budget_s
        with stop.handling():  # installed once by the command; this covers a call from Python
            while state.step < cfg.train.steps:
                if dist.broadcast(bool(budget) and time.perf_counter() - t0 > budget):  # the main process's clock
                    echo(f"rlft: time budget of {budget:g} s spent after {state.step} RL steps")
                    break
                before = _data_position(state)
                try:
                    metrics = rl_step(state, cfg)
                except stop.UpdateAbandoned as e:  # its update ran past train.stop_grace_s: no checkpoint of it
                    raise _abandoned(cfg, run_dir, e.signum, state.step + 1) from None
                except stop.Stopping as e:  # during the rollout: the step is abandoned before its update ran
                    _rewind(state, before)  # the checkpoint's next step draws what this one drew
                    raise _stopped(state, cfg, run_dir, e.signum, f"during RL step {state.step + 1}") from None
                if cfg.eval.every and state.step % cfg.eval.every == 0:
                    with contextlib.suppress(stop.Stopping):  # stopped during validation: logged without it
                        metrics.update(validation(policy, tokenizer, held_out, cfg))
                if dist.is_main and cfg.log.samples_every and state.step % cfg.log.samples_every == 0:
                    append_jsonl(run_dir / "samples.jsonl", sample_records(state, state.step, cfg.log.samples_groups))
                values, warnings = state.health.update(state.step, metrics, state.reward_errors)
                metrics.update(values)
                for line in warnings:
                    echo(f"rlft: health warning: {line}")
                if log is not None:
                    log.log(state.step, metrics)
                halt_on_skips(state, cfg, run_dir)
                halt_on_rewards(state, cfg, run_dir)
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", len=f"{metrics['response_length/mean']:.1f}")
                saved = cfg.train.checkpoint_every and state.step % cfg.train.checkpoint_every == 0
                if saved and state.step < cfg.train.steps:
                    save_checkpoint(state, cfg, run_dir)
                signum = dist.broadcast(stop.requested())  # the main process's: every process stops after one step
                if signum is not None:
                    raise _stopped(state, cfg, run_dir, signum, f"after RL step {state.step}",
                                   saved=saved and state.step < cfg.train.steps)
    finally:
        if state.rollouts is not None:  # a rollout still in flight (a time budget, an error): waited for, dropped
            state.rollouts.close()
        bar.close()
        if log is not None:
            log.close()
    write_json(run_dir / "health.json", state.health.report())
    if state.critic is not None:
        critic, _ = strategy().whole_state(state.critic, tied_once=False)  # every process takes part; None: not sharded
        if dist.is_main:
            checkpoint.write_dir(run_dir / "critic", lambda tmp: state.critic.save_pretrained(tmp, state_dict=critic))
    if dist.is_main and state.rm_refresh is not None:
        checkpoint.write_dir(run_dir / RUN_RM, state.rm_refresh.save)


def pretrain_critic(state: RLState, cfg: Config, run_dir: Path) -> None:
    """VAPO value pre-training (Yuan et al. 2025 §3.1): critic-only steps on rollouts of the frozen initial policy."""
    log = MetricsLog(run_dir, filename="critic_pretrain_metrics.jsonl") if state.dist.is_main else None
    bar = progress_bar(cfg.critic.pretrain_steps, "critic", cfg)
    try:
        for step in range(1, cfg.critic.pretrain_steps + 1):
            stop.check("the critic's pre-training (no checkpoint before RL starts)")
            m = rl_step(state, cfg, train_policy=False)
            if log is not None:
                log.log(step, {k: v for k, v in m.items() if k.startswith(("critic/", "reward/mean", "timing_s/"))})
            bar.update(1)
            bar.set_postfix(vf_loss=f"{m['critic/vf_loss']:.4f}")
    finally:
        bar.close()
        if log is not None:
            log.close()


def _data_position(state: RLState) -> tuple[dict, dict]:
    """The prompt sampler's state and the random states before a step: what its rollout moves on."""
    return copy.deepcopy(state.sampler.state_dict()), checkpoint.rng_state()


def _rewind(state: RLState, position: tuple[dict, dict]) -> None:
    """Back to ``_data_position``'s point, for a step abandoned in its rollout (its prompts are drawn again)."""
    state.sampler.load_state_dict(position[0])
    checkpoint.set_rng_state(position[1])


def _stopped(state: RLState, cfg: Config, run_dir: Path, signum: int, where: str, saved: bool = False):
    """The error that ends the RL loop on a stop signal, after the checkpoint of its last finished step (written
    now unless ``saved``)."""
    if not saved:
        save_checkpoint(state, cfg, run_dir)
    return stop.halted(signum, where, run_dir / "checkpoints" / f"step_{state.step:06d}")


def _abandoned(cfg: Config, run_dir: Path, signum: int, step: int):
    """The error that ends the RL loop when RL step ``step``'s update outlived ``train.stop_grace_s`` after a stop
    signal: the weights are half updated, so the run ends at its last checkpoint, writing none."""
    ckpt = checkpoint.latest(run_dir)
    then = (f"the update was still running {cfg.train.stop_grace_s:g} s after the signal (train.stop_grace_s) and "
            "was abandoned half applied, so no checkpoint of this step was written; "
            + (f"train.resume=true continues from {ckpt}" if ckpt is not None else
               "there is no checkpoint yet: train.resume=true starts the run over"))
    return stop.halted(signum, f"during the update of RL step {step}", then=then)


def validation(policy, tokenizer, held_out: list[HeldOut], cfg: Config) -> dict[str, float]:
    """The held-out evaluation during RL, every set's, as ``val/<set>/<metric>`` metrics (the policy's training
    mode kept)."""
    was_training = policy.training
    with strategy().gathered(policy):
        results = current().on_main(lambda: evaluate_sets(policy, tokenizer, held_out, cfg))
    policy.train(was_training)
    return val_metrics(results, held_out[0].name)


def halt_on_skips(state: RLState, cfg: Config, run_dir: Path) -> None:
    """Stop after ``train.max_consecutive_skips`` RL steps in a row that could not update (non-finite gradients)."""
    limit = cfg.train.max_consecutive_skips
    if not limit or state.consecutive_skips < limit:
        return
    ckpt = checkpoint.latest(run_dir)
    where = (f"the last checkpoint is {ckpt} (train.resume=true continues from it)" if ckpt is not None else
             f"there is no checkpoint yet (train.save_every={cfg.train.save_every}: "
             + (f"every {cfg.train.checkpoint_every} steps)" if cfg.train.checkpoint_every else "none)"))
    first = state.step - state.consecutive_skips + 1
    raise TrainingHalted(
        f"RL steps {first}-{state.step}: every update met a non-finite loss or gradient and was skipped "
        f"({state.consecutive_skips} in a row, train.max_consecutive_skips={limit}); {where}. "
        "Try a lower optim.lr, optim.grad_clip, or check the rewards and the data for extreme values")


def halt_on_rewards(state: RLState, cfg: Config, run_dir: Path) -> None:
    """Stop, after writing a checkpoint, once a reward (or the environment, losing its trajectories) has failed on
    at least 90% of the samples of ``health.reward_fail_steps`` RL steps in a row (``HealthMonitor.failing_reward``)."""
    found = state.health.failing_reward()
    if found is None:
        return
    name, first, n, error = found
    what = f"the environment (env.name={cfg.env.name})" if name == ENV else f"reward {name!r}"
    save_checkpoint(state, cfg, run_dir)
    raise TrainingHalted(
        f"{what} failed on at least 90% of the samples of RL steps {first}-{state.step} ({n} in a row, "
        f"health.reward_fail_steps={cfg.health.reward_fail_steps}); first error: {error or 'not recorded'}. "
        f"Checkpoint {checkpoint.latest(run_dir)} written: fix it, then train.resume=true continues from it")


def progress_bar(total: int, desc: str, cfg: Config, initial: int = 0):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not (cfg.log.progress and current().is_main),
                dynamic_ncols=True)
