"""``rlft train``: SFT warm-up (optional) -> evaluation -> RL -> evaluation, in one run directory.

Run directory layout::

    runs/<name>/config.yaml        the resolved configuration
    runs/<name>/metrics.jsonl      one JSON object per RL step
    runs/<name>/sft_metrics.jsonl  SFT warm-up losses (when SFT runs)
    runs/<name>/eval.json          {"before_rl": {...}, "after_rl": {...}}
    runs/<name>/policy/            final policy + tokenizer (save_pretrained)
    runs/<name>/critic/            final critic (backbone save_pretrained + value_head.pt), with a critic
    runs/<name>/reward_model/      the run's reward model, refreshed in RL (only with rm.refresh_every > 0)
    runs/<name>/critic_pretrain_metrics.jsonl  VAPO value pre-training (critic.pretrain_steps > 0)
    runs/<name>/checkpoints/       step_N/{policy/, state.pt} every train.save_every steps
    runs/<name>/base_model/        the embedded tiny model (only when model.path is empty)
    runs/<name>/samples.jsonl      sampled completions with their rewards (log.samples_every)
    runs/<name>/health.json        the health warnings that fired
    runs/<name>/report.html        the run on one page
    runs/<name>/plots/             its curves as PNG files (log.plots, with matplotlib)

Under ``accelerate launch`` / ``torchrun`` the RL steps are data-parallel (``rlft.parallel.dist``); the SFT warm-up
and the evaluations run in the main process while the others wait, and only the main process writes.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import shutil
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from rlft.runs import checkpoint, malloc
from rlft.parallel import zero
from rlft.config import Config, ConfigError, with_name
from rlft.core.kl import make_kl_controller
from rlft.data.loaders import load_examples
from rlft.data.schema import Example
from rlft.data.synthetic import configured_task
from rlft.data.templates import encode_prompts
from rlft.runs.disk import check_disk
from rlft.parallel.dist import current, init_dist
from rlft.errors import TrainingHalted, WriteFailed, writing
from rlft.parallel.fsdp import (check_supported, full_model_state, full_optimizer_state, gathered, is_sharded,
                       load_optimizer_state, shard_)
from rlft.insight.eval import HeldOut, evaluate_sets, load_sets, primary_set, val_metrics
from rlft.insight.health import HealthMonitor
from rlft.insight.plot import write_run_plots
from rlft.insight.report import build_report
from rlft.models.loading import check_model_path, load_policy, quiet_transformers, resolve_device
from rlft.models.lora import AdaptersOff, add_lora, is_adapter_dir, is_peft, load_adapters, merged_copy, save_policy
from rlft.models.tiny import build_tiny_model
from rlft.rewards import REWARDS
from rlft.rewards.jail import JailUnavailable
from rlft.rewards.pool import RewardPool
from rlft.rewards.terms import built
from rlft.runs.tracking import MetricsLog, truncate_jsonl, write_atomic
from rlft.trainers.optim import make_optimizer, make_scheduler
from rlft.trainers.rl import PromptSampler, RLState, penalty_controller, rl_step, sample_records
from rlft.trainers.rm_refresh import RUN_RM, RMRefresh, own_reward_model
from rlft.trainers.sft import train_sft


@dataclass
class RunResult:
    run_dir: Path
    eval: dict
    seconds: float


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def process_settings(cfg: Config) -> None:
    """``train.threads`` CPU threads for torch (0 leaves torch's default) and the allocator's ``train.malloc``."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    malloc.apply(cfg.train.malloc)


def load_task(cfg: Config) -> tuple[list[Example], list[Example]]:
    d = cfg.data
    if d.source.startswith("synthetic:"):
        return configured_task(d.source, d, cfg.train.seed, d.num_eval or 500)
    keys = {"prompt_key": d.prompt_key, "answer_key": d.answer_key or None, "response_key": d.response_key or None}
    train = load_examples(d.source, d.train_split, **keys)
    held_out = load_examples(d.source, d.eval_split, **keys)
    return train[: d.num_train or None], held_out[: d.num_eval or None]


def prepare_run_dir(cfg: Config) -> Config:
    """Resolve the run name, create the directory and write config.yaml (refusing to clobber another run); with
    several processes the main one does it, and they all take its name."""
    dist = current()
    if not cfg.log.name:
        cfg = with_name(cfg, dist.broadcast(time.strftime("%Y%m%d-%H%M%S")))
    with dist.main_first():
        if dist.is_main:
            _make_run_dir(cfg)
    return cfg


def _make_run_dir(cfg: Config) -> None:
    path = cfg.log.path
    if path.exists() and any(path.iterdir()) and not cfg.train.resume:
        raise ConfigError(f"log.name: run directory {path} already exists; choose another name, "
                          "or resume it with train.resume=true")
    check_disk(cfg, path)  # a writable directory with room for the run, before anything is written
    saved = yaml.safe_load(cfg.to_yaml())
    saved["train"]["resume"] = False  # the file describes the run; resuming is a choice made on the command line
    made = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        write_atomic(path / "config.yaml", yaml.safe_dump(saved, sort_keys=False))
    except (OSError, WriteFailed) as e:  # after the checks above: the disk filled up or changed in between
        if made:
            shutil.rmtree(path, ignore_errors=True)
        raise ConfigError(f"log.run_dir: cannot write the run directory {path} ({e}); choose another "
                          "log.run_dir") from None


def base_model_dir(cfg: Config, run_dir: Path) -> str:
    """``model.path``, or the embedded tiny model built once in ``run_dir/base_model`` when it is empty."""
    if cfg.model.path:
        return cfg.model.path
    path = run_dir / "base_model"
    dist = current()
    with dist.main_first():
        if dist.is_main and not (path / "config.json").exists():
            m = cfg.model
            checkpoint.write_dir(path, lambda tmp: build_tiny_model(
                str(tmp), hidden_size=m.tiny_hidden_size, layers=m.tiny_layers, heads=m.tiny_heads,
                seed=cfg.train.seed))
    return str(path)


def append_jsonl(path: Path, records: list[dict]) -> None:
    with writing(path), path.open("a", encoding="utf-8") as f:  # a line cut short is dropped on resume
        f.writelines(json.dumps(r) + "\n" for r in records)


def _silent(*args, **kwargs) -> None:
    """The ``echo`` of the processes other than the main one."""


def _write_json(path: Path, obj: dict) -> None:
    if not current().is_main:
        return
    write_atomic(path, json.dumps(obj, indent=2))


def train(cfg: Config, *, echo=print) -> RunResult:
    """Run the whole pipeline described by ``cfg``; returns where it was written and the evaluation."""
    t0 = time.perf_counter()
    quiet_transformers()
    process_settings(cfg)
    dist = init_dist(cfg.model.device)
    echo = echo if dist.is_main else _silent
    ckpt = None
    if cfg.train.resume:  # checked before anything is written: a wrong name must not leave a directory behind
        ckpt = checkpoint.latest(cfg.log.path)
        if ckpt is None:
            raise ConfigError(f"train.resume: no checkpoint under {cfg.log.path / 'checkpoints'}")
    train_ex, eval_ex, extra_sets = preflight(cfg)
    if dist.shard is not None:
        check_supported(cfg, dist.shard)
    if dist.zero is not None:
        zero.check_supported(cfg, dist.zero)
    if cfg.train.prompts_per_step < dist.world:
        raise ConfigError(f"train.prompts_per_step: {cfg.train.prompts_per_step} prompts cannot be shared by "
                          f"{dist.world} processes; use at least one per process")
    cfg = prepare_run_dir(cfg)
    run_dir = cfg.log.path
    with removed_if_start_fails(run_dir, keep=cfg.train.resume):
        with dist.main_first():  # rm.refresh_every: the run scores with (and refreshes) its own copy
            cfg = own_reward_model(cfg, run_dir)
        seed_everything(cfg.train.seed)
        device = resolve_device(cfg.model.device)

        model_path = base_model_dir(cfg, run_dir)
        with dist.main_first():  # LoRA on a pipeline's adapters writes their merged base once
            policy, tokenizer = training_policy(cfg, model_path, ckpt, run_dir)
        n_params = sum(p.numel() for p in policy.parameters())
        n_train = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        trains = f", {n_train / 1e6:.3f}M of them LoRA adapters" if cfg.lora.rank else ""
        echo(f"rlft: run {run_dir}  model {cfg.model.path or 'embedded tiny'} ({n_params / 1e6:.2f}M params"
             f"{trains}) on {device}")
        train_prompts = encode_prompts(train_ex, cfg.data.template, tokenizer, cfg.data.max_prompt_tokens,
                                       "train data")
        held_out = [h.encode(tokenizer, cfg) for h in (primary_set(cfg, eval_ex), *extra_sets)]
    echo(f"rlft: {len(train_ex)} training prompts, {len(eval_ex)} held-out"
         + "".join(f", {len(h.examples)} in {h.name}" for h in extra_sets)
         + (f"; {dist.world} processes" if dist.active else ""))

    results = json.loads((run_dir / "eval.json").read_text()) if ckpt and (run_dir / "eval.json").exists() else {}
    with _reward_pool(cfg), stops_on_write_failure(run_dir):
        if ckpt is None:
            if cfg.sft.steps:  # in the main process; the others then take its weights
                dist.on_main(lambda: _run_sft(policy, tokenizer, train_ex, cfg, run_dir))
                dist.sync_params_(policy)
            if cfg.eval.before_rl:
                results["before_rl"] = _eval(policy, tokenizer, held_out, cfg, echo, "before RL")
                _write_json(run_dir / "eval.json", results)

        _run_rl(policy, tokenizer, train_ex, train_prompts, cfg, run_dir, ckpt, echo, held_out)

        results["after_rl"] = _eval(policy, tokenizer, held_out, cfg, echo, "after RL")
        _write_json(run_dir / "eval.json", results)
    whole = full_model_state(policy) if is_sharded(policy) else None  # every process takes part; the main one writes
    if dist.is_main:
        with stops_on_write_failure(run_dir):  # policy/ appears whole or not at all
            checkpoint.write_dir(run_dir / "policy",
                                 lambda tmp: save_policy(policy, tokenizer, tmp, cfg.lora.save, state_dict=whole))
            with writing(run_dir / "report.html"):
                build_report(run_dir)
            if cfg.log.plots:
                write_run_plots(run_dir, echo)
    dist.barrier()  # the run's files are complete when any process returns
    seconds = time.perf_counter() - t0
    echo(summary(results, seconds, run_dir))
    return RunResult(run_dir=run_dir, eval=results, seconds=seconds)


def preflight(cfg: Config, stages: Sequence[str] = ()) -> tuple[list[Example], list[Example], list[HeldOut]]:
    """What can fail on the user's input, checked before anything is written: the model and critic paths, the
    task's data, the extra held-out sets of eval.sets and the data of the ``stages`` that will run (sft.source for
    an sft stage or an SFT warm-up, rm.source, dpo.source), each read whole: a missing file or a malformed row
    fails here, naming file, row and field. Returns the training and held-out examples and the extra sets."""
    if cfg.model.path:
        check_model_path(cfg.model.path, "model.path")
    if cfg.critic.path:
        check_model_path(cfg.critic.path, "critic.path")
    if cfg.sft.source and ("sft" in stages or cfg.sft.steps):
        from rlft.trainers.sft import sft_examples

        sft_examples(cfg, [])
    for name in ("rm", "dpo"):
        if name in stages and getattr(cfg, name).source:
            from rlft.data.rankings import load_rankings

            load_rankings(cfg, getattr(cfg, name), name)
    return (*load_task(cfg), load_sets(cfg))


@contextlib.contextmanager
def removed_if_start_fails(run_dir: Path, *, keep: bool):
    """A run whose start fails (before any training) removes the directory it created, so nothing half-written is
    left behind; ``keep`` (a resumed run) leaves it alone."""
    try:
        yield
    except BaseException:
        if not keep and current().is_main:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


@contextlib.contextmanager
def stops_on_write_failure(run_dir: Path):
    """A failed write (:class:`WriteFailed`: a full disk, a read-only directory) ends the run with the path that
    failed and where to continue from: the last checkpoint, which the failure left intact."""
    try:
        yield
    except WriteFailed as e:
        raise e.advised(resume_advice(run_dir)) from e.cause


def resume_advice(run_dir: Path) -> str:
    ckpt = checkpoint.latest(run_dir)
    if ckpt is None:
        return ("There is no checkpoint to continue from (none written yet, or train.save_every=0): free some space "
                "or fix the directory, then start the run again")
    return (f"The last good checkpoint is {ckpt}: free some space or fix the directory, then continue from it with "
            "train.resume=true")


def _reward_pool(cfg: Config):
    """Worker processes for the run's slow rewards (training and evaluation), or nothing when none is slow."""
    rules = [cfg.eval.correct_fn, cfg.eval.format_fn,
             *(name for s in cfg.eval.sets for name in (s.correct_fn, s.format_fn) if name)]  # every set's rules
    fns = [fn for _, fn in built(cfg.reward)] + [REWARDS.get(name) for name in rules]
    for fn in fns:
        if hasattr(fn, "preflight"):
            try:
                fn.preflight()
            except JailUnavailable as e:
                raise ConfigError(f"reward.sandbox={getattr(fn, 'sandbox', '?')}: {e}") from None
    if not any(getattr(fn, "runs_in_pool", False) for fn in fns):
        return contextlib.nullcontext()
    return RewardPool(workers=cfg.reward.workers, deadline_s=cfg.reward.timeout_s).activated()


def training_policy(cfg: Config, model_path: str, ckpt: Path | None, work_dir: Path) -> tuple:
    """(policy, tokenizer) to train: the model at ``model_path`` (or a checkpoint's), with LoRA adapters when
    ``lora.rank`` > 0 (a checkpoint's own adapters when resuming) and activation checkpointing when asked.

    New adapters on a directory of adapters (a pipeline's earlier LoRA stage) need their base on disk, since
    saved adapters name the directory they apply to: the merged model is written once to ``work_dir/base_model``."""
    if cfg.lora.rank:
        if is_adapter_dir(model_path):
            model_path = merged_copy(model_path, cfg.model, work_dir / "base_model")
        policy, tokenizer = load_policy(model_path, cfg.model)
        policy = load_adapters(policy, ckpt / "policy", trainable=True) if ckpt else add_lora(policy, cfg.lora)
    else:
        policy, tokenizer = load_policy(str(ckpt / "policy") if ckpt else model_path, cfg.model)
    plan = current().shard
    if cfg.model.gradient_checkpointing or (plan is not None and plan.activation_checkpointing):
        _enable_checkpointing(policy)
        if cfg.lora.rank:  # frozen embeddings: the checkpointed blocks need an input that requires grad
            policy.enable_input_require_grads()
    return policy, tokenizer


def _enable_checkpointing(model) -> None:
    """Activation checkpointing under its transformers >= 5 name, or the older one."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def _run_sft(policy, tokenizer, train_ex, cfg: Config, run_dir: Path) -> None:
    log = MetricsLog(run_dir, tensorboard=False, filename="sft_metrics.jsonl")
    bar = _bar(cfg.sft.steps, "sft", cfg)
    def on_step(step: int, m: dict) -> None:
        log.log(step, m)
        bar.update(1)
        bar.set_postfix(loss=f"{m['sft/loss']:.3f}")
    try:
        train_sft(policy, tokenizer, train_ex, cfg, on_step)
    finally:
        bar.close()
        log.close()


def _run_rl(policy, tokenizer, train_ex, train_prompts, cfg: Config, run_dir: Path, ckpt, echo,
            held_out: list[HeldOut]) -> None:
    t0 = time.perf_counter()
    dist = current()
    state = _rl_state(policy, tokenizer, train_ex, train_prompts, cfg)
    state.dist = dist
    if ckpt is not None:
        _restore(state, ckpt, run_dir, echo)
    else:
        if dist.rank:  # each process samples its own share of the groups: its own random stream
            seed_everything(cfg.train.seed + PROCESS_SEED_STRIDE * dist.rank)
        if state.critic is not None and cfg.critic.pretrain_steps:
            _pretrain_critic(state, cfg, run_dir)
    log = MetricsLog(run_dir, tensorboard=cfg.log.tensorboard) if dist.is_main else None
    bar = _bar(cfg.train.steps, "rl", cfg, initial=state.step)
    policy.train()
    try:
        budget = cfg.train.time_budget_s
        with StopSignals() as stop:
            while state.step < cfg.train.steps:
                if dist.broadcast(bool(budget) and time.perf_counter() - t0 > budget):  # the main process's clock
                    echo(f"rlft: time budget of {budget:g} s spent after {state.step} RL steps")
                    break
                metrics = rl_step(state, cfg)
                if cfg.eval.every and state.step % cfg.eval.every == 0:
                    metrics.update(validation(policy, tokenizer, held_out, cfg))
                if dist.is_main and cfg.log.samples_every and state.step % cfg.log.samples_every == 0:
                    append_jsonl(run_dir / "samples.jsonl", sample_records(state, state.step, cfg.log.samples_groups))
                values, warnings = state.health.update(state.step, metrics)
                metrics.update(values)
                for line in warnings:
                    echo(f"rlft: health warning: {line}")
                if log is not None:
                    log.log(state.step, metrics)
                _halt_on_skips(state, cfg, run_dir)
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", len=f"{metrics['response_length/mean']:.1f}")
                saved = cfg.train.save_every and state.step % cfg.train.save_every == 0
                if saved and state.step < cfg.train.steps:
                    _save_checkpoint(state, cfg, run_dir)
                signum = dist.broadcast(stop.signum)  # the main process's: every process stops after the same step
                if signum is not None:
                    if not saved or state.step == cfg.train.steps:
                        _save_checkpoint(state, cfg, run_dir)
                    name = signal.Signals(signum).name
                    raise TrainingHalted(f"{name} after RL step {state.step}: checkpoint "
                                         f"{run_dir / 'checkpoints' / f'step_{state.step:06d}'} written; "
                                         "train.resume=true continues from it", exit_code=128 + signum)
    finally:
        bar.close()
        if log is not None:
            log.close()
    _write_json(run_dir / "health.json", state.health.report())
    if state.critic is not None:
        critic = full_model_state(state.critic, tied_once=False) if is_sharded(state.critic) else None  # all take part
        if dist.is_main:
            checkpoint.write_dir(run_dir / "critic", lambda tmp: state.critic.save_pretrained(tmp, state_dict=critic))
    if dist.is_main and state.rm_refresh is not None:
        checkpoint.write_dir(run_dir / RUN_RM, state.rm_refresh.save)


class StopSignals:
    """While active, SIGINT and SIGTERM ask the RL loop to stop after the current step (``signum``), which then
    writes a checkpoint and exits; a second SIGINT interrupts at once. Outside the main thread it does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def validation(policy, tokenizer, held_out: list[HeldOut], cfg: Config) -> dict[str, float]:
    """The held-out evaluation during RL, every set's, as ``val/<set>/<metric>`` metrics (the policy's training
    mode kept)."""
    was_training = policy.training
    with gathered(policy):
        results = current().on_main(lambda: evaluate_sets(policy, tokenizer, held_out, cfg))
    policy.train(was_training)
    return val_metrics(results, held_out[0].name)


def _halt_on_skips(state: RLState, cfg: Config, run_dir: Path) -> None:
    """Stop after ``train.max_consecutive_skips`` RL steps in a row that could not update (non-finite gradients)."""
    limit = cfg.train.max_consecutive_skips
    if not limit or state.consecutive_skips < limit:
        return
    ckpt = checkpoint.latest(run_dir)
    where = (f"the last checkpoint is {ckpt} (train.resume=true continues from it)" if ckpt is not None else
             "there is no checkpoint (train.save_every=0)")
    first = state.step - state.consecutive_skips + 1
    raise TrainingHalted(
        f"RL steps {first}-{state.step}: every update met a non-finite loss or gradient and was skipped "
        f"({state.consecutive_skips} in a row, train.max_consecutive_skips={limit}); {where}. "
        "Try a lower optim.lr, optim.grad_clip, or check the rewards and the data for extreme values")


PROCESS_SEED_STRIDE = 1_000_003  # process r > 0 of a multi-process run seeds its sampling with seed + r * this


def _save_checkpoint(state: RLState, cfg: Config, run_dir: Path) -> None:
    """A checkpoint of the run, written by the main process with the random states of every process."""
    rngs = state.dist.gather(checkpoint.rng_state())
    model_state = optimizer_state = ref_state = None
    if is_sharded(state.policy):  # whole state dicts, gathered by every process into the main one
        model_state = full_model_state(state.policy)
        optimizer_state = full_optimizer_state(state.policy, state.optimizer)
    if is_sharded(state.ref):
        ref_state = full_model_state(state.ref, tied_once=False)
    critic_states = None
    if is_sharded(state.critic):
        critic_states = (full_model_state(state.critic, tied_once=False),
                         full_optimizer_state(state.critic, state.critic_optimizer))
    if state.dist.is_main:
        checkpoint.save(run_dir, state.step, model=state.policy, tokenizer=state.tokenizer,
                        optimizer=state.optimizer, scheduler=state.scheduler, keep=cfg.train.keep_checkpoints,
                        trainer_state=state.trainer_state(ref_state, critic_states), process_rngs=rngs,
                        model_state=model_state, optimizer_state=optimizer_state)


def _rl_state(policy, tokenizer, train_ex, train_prompts, cfg: Config) -> RLState:
    """Optimizer and schedule of the policy, plus the reference model, critic, KL controller and ptx data it needs."""
    o, a = cfg.optim, cfg.algo
    ref = None
    if a.needs_ref:  # the frozen policy as it enters RL; under LoRA the base, i.e. the policy without its adapters
        ref = AdaptersOff(policy) if is_peft(policy) else copy.deepcopy(policy).eval().requires_grad_(False)
    critic = _build_critic(policy, cfg) if a.needs_critic else None  # from the policy's weights before sharding
    plan = current().shard
    if plan is not None:  # an FSDP launch: the policy's parameters, gradients and AdamW state split over processes
        for model in (policy, ref, critic):  # the reference (unless LoRA's view of the policy) and the critic too
            if isinstance(model, torch.nn.Module):
                shard_(model, plan)
    optimizer = make_optimizer(policy.parameters(), lr=o.lr, weight_decay=o.weight_decay, betas=(o.beta1, o.beta2),
                               eps=o.eps)
    total_opt_steps = cfg.train.steps * a.epochs * a.minibatches
    scheduler = make_scheduler(optimizer, warmup=o.warmup_steps, total=total_opt_steps, schedule=o.schedule)
    if current().zero is not None:  # a DeepSpeed launch: AdamW's state (and gradients, parameters) split by ZeRO
        zero.wrap(policy, optimizer, current().zero, o.grad_clip)
        if isinstance(ref, torch.nn.Module):  # the reference's parameters too, at stage 3 (not LoRA's view)
            zero.wrap_frozen(ref, current().zero)
    state = RLState(policy=policy, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
                    sampler=PromptSampler(len(train_ex), cfg.train.seed), examples=train_ex, prompts=train_prompts)
    state.penalty_ctl = penalty_controller(state, cfg)  # PPO-penalty's adaptive beta, when the loss reads one
    state.health = HealthMonitor(cfg.health)
    if cfg.rm.refresh_every:  # the reward model the run scores with, retrained on its rollouts
        state.rm_refresh = RMRefresh(cfg)
    if ref is not None:
        state.ref = ref
        state.kl_ctl = make_kl_controller(a.kl_coef, a.kl_target, a.kl_horizon)
    if critic is not None:
        state.critic = critic
        c = cfg.critic
        state.critic_optimizer = make_optimizer(state.critic.parameters(), lr=c.lr, weight_decay=o.weight_decay,
                                                betas=(o.beta1, o.beta2), eps=o.eps)
        critic_steps = (cfg.train.steps + c.pretrain_steps) * a.epochs * a.minibatches
        state.critic_scheduler = make_scheduler(state.critic_optimizer, warmup=c.warmup_steps, total=critic_steps,
                                                schedule=o.schedule)
        if current().zero is not None:  # a DeepSpeed launch: the critic in an engine of its own
            zero.wrap(critic, state.critic_optimizer, current().zero, c.grad_clip)
    if a.ptx_coef > 0:
        from rlft.trainers.ptx import PtxData

        state.ptx = PtxData.from_config(cfg, tokenizer, train_ex)  # data.ptx_source=task: train_ex as SFT renders them
    return state


def _build_critic(policy, cfg: Config):
    """A critic on ``critic.path``, or on the policy's weights as they enter RL (a separate copy) when empty."""
    from rlft.models.critic import Critic, load_critic

    device = next(policy.parameters()).device
    if cfg.critic.path:
        return load_critic(cfg.critic.path, dtype=cfg.model.dtype, device=device,
                           trust_remote_code=cfg.model.trust_remote_code).train()
    whole = copy.deepcopy(policy).merge_and_unload() if is_peft(policy) else policy  # LoRA: base + adapters, merged
    backbone = copy.deepcopy(whole.base_model)  # the decoder without its LM head
    return Critic(backbone.requires_grad_(True)).train()  # trained whole, as from critic.path (LoRA froze the base)


def _pretrain_critic(state: RLState, cfg: Config, run_dir: Path) -> None:
    """VAPO value pre-training (Yuan et al. 2025 §3.1): critic-only steps on rollouts of the frozen initial policy."""
    log = MetricsLog(run_dir, tensorboard=False, filename="critic_pretrain_metrics.jsonl") if state.dist.is_main \
        else None
    bar = _bar(cfg.critic.pretrain_steps, "critic", cfg)
    try:
        for step in range(1, cfg.critic.pretrain_steps + 1):
            m = rl_step(state, cfg, train_policy=False)
            if log is not None:
                log.log(step, {k: v for k, v in m.items() if k.startswith(("critic/", "reward/mean", "timing_s/"))})
            bar.update(1)
            bar.set_postfix(vf_loss=f"{m['critic/vf_loss']:.4f}")
    finally:
        bar.close()
        if log is not None:
            log.close()


def _restore(state: RLState, ckpt: Path, run_dir: Path, echo) -> None:
    saved = checkpoint.load_state(ckpt)
    load_optimizer_state(state.policy, state.optimizer, saved["optimizer"])
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
    if dist.is_main:
        truncate_jsonl(run_dir / "metrics.jsonl", state.step)
        truncate_jsonl(run_dir / "samples.jsonl", state.step)
    echo(f"rlft: resumed from {ckpt} at step {state.step}")


def _eval(policy, tokenizer, held_out: list[HeldOut], cfg: Config, echo, label: str) -> dict:
    """The held-out evaluation of every set, run by the main process; every process gets its results."""
    extra = "".join(f" and {len(h.examples)} in {h.name}" for h in held_out[1:])
    echo(f"rlft: evaluating {label} on {len(held_out[0].examples)} held-out problems{extra}")
    with gathered(policy):
        return current().on_main(lambda: evaluate_sets(policy, tokenizer, held_out, cfg))


def _bar(total: int, desc: str, cfg: Config, initial: int = 0):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not (cfg.log.progress and current().is_main),
                dynamic_ncols=True)


def summary(results: dict, seconds: float, run_dir: Path) -> str:
    before, after = results.get("before_rl"), results.get("after_rl", {})
    ks = [k for k in after if k.startswith("pass@")]
    lines = ["", "rlft summary", "-" * 56,
             f"{'':22}{'before RL':>12}{'after RL':>12}"]
    for key in ["exact_match", "format_rate", *ks]:
        b = f"{before[key]:.3f}" if before and key in before else "-"
        lines.append(f"{key:22}{b:>12}{after.get(key, float('nan')):>12.3f}")
    for name, part in after.get("sets", {}).items():  # the extra held-out sets (eval.sets)
        was = (before or {}).get("sets", {}).get(name, {})
        for key in ["exact_match", "format_rate", *ks]:
            b = f"{was[key]:.3f}" if key in was else "-"
            lines.append(f"{name + '/' + key:22}{b:>12}{part.get(key, float('nan')):>12.3f}")
    lines += [f"held-out problems     {after.get('n', 0)}"
              + "".join(f", {part.get('n', 0)} in {name}" for name, part in after.get("sets", {}).items()),
              f"time                  {seconds:.1f} s",
              f"run directory         {run_dir}",
              f"final policy          {run_dir / 'policy'}"]
    health = json.loads((run_dir / "health.json").read_text()) if (run_dir / "health.json").is_file() else {}
    lines.append(f"health warnings       {len(health) or 'none'}")
    for name, h in health.items():
        lines.append(f"  {name}: steps {h['first_step']}-{h['last_step']} ({h['steps']} steps): {h['advice']}")
    return "\n".join(lines)
