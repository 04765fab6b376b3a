"""The state of an RL run: the policy's optimizer and schedule, the reference, the critic, the controllers and the
ptx data (``build_rl_state``), and its checkpoints (``save_checkpoint``, ``restore``)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from rlft.config import Config, ConfigError
from rlft.core.kl import make_kl_controller
from rlft.data.samplers import PromptStats, make_sampler
from rlft.insight.health import HealthMonitor
from rlft.models.lora import AdaptersOff, is_peft
from rlft.parallel.launch import strategy
from rlft.runs import checkpoint
from rlft.runs.resume import record
from rlft.runs.start import seed_everything
from rlft.runs.tracking import truncate_jsonl
from rlft.trainers.optim import make_optimizer, make_scheduler, retune
from rlft.trainers.state import RLState
from rlft.trainers.rl import penalty_controller
from rlft.trainers.rm_refresh import RMRefresh


PROCESS_SEED_STRIDE = 1_000_003  # process r > 0 of a multi-process run seeds its sampling with seed + r * this


def build_rl_state(policy, tokenizer, train_ex, train_prompts, cfg: Config, teachers=()) -> RLState:
    """Optimizer and schedule of the policy, plus the reference model, critic, KL controller and ptx data it needs;
    ``teachers``: the distill stage's frozen teachers (``rlft.trainers.distill.load_teachers``), placed as the
    reference is."""
    o, a = cfg.optim, cfg.algo
    ref = None
    if a.needs_ref:  # the frozen policy as it enters RL; under LoRA the base, i.e. the policy without its adapters
        ref = AdaptersOff(policy) if is_peft(policy) else copy.deepcopy(policy).eval().requires_grad_(False)
    critic = build_critic(policy, cfg) if a.needs_critic else None  # from the policy's weights before they are placed
    s, made = strategy(), {}

    def policy_optimizer(params) -> torch.optim.Optimizer:  # AdamW and its schedule, on the parameters as placed
        opt = make_optimizer(params, lr=o.lr, weight_decay=o.weight_decay, betas=(o.beta1, o.beta2), eps=o.eps)
        made["scheduler"] = make_scheduler(opt, warmup=o.warmup_steps, total=cfg.train.steps * a.epochs * a.minibatches,
                                           schedule=o.schedule)
        return opt

    def critic_optimizer(params) -> torch.optim.Optimizer:
        c = cfg.critic
        opt = make_optimizer(params, lr=c.lr, weight_decay=o.weight_decay, betas=(o.beta1, o.beta2), eps=o.eps)
        made["critic_scheduler"] = make_scheduler(opt, warmup=c.warmup_steps, schedule=o.schedule,
                                                  total=(cfg.train.steps + c.pretrain_steps) * a.epochs * a.minibatches)
        return opt

    optimizer = s.prepare(policy, policy_optimizer, grad_clip=o.grad_clip)
    s.prepare(ref)  # frozen; nothing to place for LoRA's view of the policy
    for teacher in teachers:
        s.prepare(teacher)  # frozen, as the reference
    if critic is not None:
        made["critic_optimizer"] = s.prepare(critic, critic_optimizer, grad_clip=cfg.critic.grad_clip)
    scheduler = made["scheduler"]
    stats = PromptStats(len(train_ex))  # read by data.sampler=prioritised (and curriculum without estimates)
    state = RLState(policy=policy, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
                    sampler=make_sampler(train_ex, cfg, stats), examples=train_ex, prompts=train_prompts, stats=stats)
    state.teachers = list(teachers)
    state.penalty_ctl = penalty_controller(state, cfg)  # PPO-penalty's adaptive beta, when the loss reads one
    state.health = HealthMonitor(cfg.health)
    if cfg.rm.refresh_every:  # the reward model the run scores with, retrained on its rollouts
        state.rm_refresh = RMRefresh(cfg)
    if ref is not None:
        state.ref = ref
        state.kl_ctl = make_kl_controller(a.kl_coef, a.kl_target, a.kl_horizon)
    if critic is not None:
        state.critic = critic
        state.critic_optimizer, state.critic_scheduler = made["critic_optimizer"], made["critic_scheduler"]
    if a.ptx_coef > 0:
        from rlft.trainers.ptx import PtxData

        state.ptx = PtxData.from_config(cfg, tokenizer, train_ex)  # data.ptx_source=task: train_ex as SFT renders them
    return state


def build_critic(policy, cfg: Config):
    """A critic on ``critic.path``, or on the policy's weights as they enter RL (a separate copy) when empty."""
    from rlft.models.critic import Critic, load_critic

    device = next(policy.parameters()).device
    if cfg.critic.path:
        return load_critic(cfg.critic.path, dtype=cfg.model.dtype, device=device,
                           trust_remote_code=cfg.model.trust_remote_code).train()
    whole = copy.deepcopy(policy).merge_and_unload() if is_peft(policy) else policy  # LoRA: base + adapters, merged
    backbone = copy.deepcopy(whole.base_model)  # the decoder without its LM head
    return Critic(backbone.requires_grad_(True)).train()  # trained whole, as from critic.path (LoRA froze the base)


def save_checkpoint(state: RLState, cfg: Config, run_dir: Path) -> None:
    """A checkpoint of the run, written by the main process with the random states of every process."""
    rngs = state.dist.gather(checkpoint.rng_state())
    s = strategy()  # a sharded model's whole state dicts, gathered by every process into the main one
    model_state, optimizer_state = s.whole_state(state.policy, state.optimizer)
    ref_state, _ = s.whole_state(state.ref, tied_once=False)
    critic_states = None
    if s.shards(state.critic):
        critic_states = s.whole_state(state.critic, state.critic_optimizer, tied_once=False)
    if state.dist.is_main:
        checkpoint.save(run_dir, state.step, model=state.policy, tokenizer=state.tokenizer,
                        optimizer=state.optimizer, scheduler=state.scheduler, keep=cfg.train.keep_checkpoints,
                        trainer_state=state.trainer_state(ref_state, critic_states), process_rngs=rngs,
                        model_state=model_state, optimizer_state=optimizer_state)


def restore(state: RLState, ckpt: Path, run_dir: Path, echo, cfg: Config) -> None:
    """The run's state from ``ckpt``, with the optimizers' hyperparameters and schedules as ``cfg`` gives them now;
    a run resumed flat in ``run_dir`` then records what changed (``rlft.runs.resume.record``)."""
    saved = checkpoint.load_state(ckpt)
    strategy().load_state(state.policy, optimizer=state.optimizer, optim_state=saved["optimizer"])
    state.scheduler.load_state_dict(saved["scheduler"])
    rngs, dist = saved.get("process_rngs") or [saved["rng"]], state.dist
    if len(rngs) == dist.world:
        checkpoint.set_rng_state(rngs[dist.rank])
    else:  # saved by another number of processes: the main stream continues, the others start afresh
        checkpoint.set_rng_state(saved["rng"])
        if dist.rank:
            seed_everything(state.step + PROCESS_SEED_STRIDE * dist.rank)
    try:
        state.load_trainer_state(saved["trainer"])
    except ValueError as e:  # the data changed since the checkpoint: the position in it means nothing
        raise ConfigError(f"train.resume: {e}; resume with the run's own data settings") from None
    o = cfg.optim
    retune(state.optimizer, state.scheduler, lr=o.lr, weight_decay=o.weight_decay, betas=(o.beta1, o.beta2), eps=o.eps)
    if state.critic is not None:
        retune(state.critic_optimizer, state.critic_scheduler, lr=cfg.critic.lr, weight_decay=o.weight_decay,
               betas=(o.beta1, o.beta2), eps=o.eps)
    echo(f"rlft: resumed from {ckpt} at step {state.step}")
    if dist.is_main:
        truncate_jsonl(run_dir / "metrics.jsonl", state.step)
        truncate_jsonl(run_dir / "samples.jsonl", state.step)
        if (Path(run_dir) / checkpoint.CONFIG).is_file():  # a run resumed flat; a pipeline records at its start
            record(run_dir, cfg, ckpt, state.step, echo)

