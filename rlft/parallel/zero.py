"""Sharded RL training under DeepSpeed ZeRO (stages 1, 2 and 3), started by ``accelerate launch`` with a DeepSpeed
configuration (``recipes/accelerate/deepspeed_zero2.yaml``, ``deepspeed_zero3.yaml``).

``accelerate launch`` sets ``ACCELERATE_USE_DEEPSPEED`` and its ``ACCELERATE_DEEPSPEED_*`` settings; rlft then
hands the RL policy and its AdamW to ``deepspeed.initialize`` (the optional extra ``rlft[deepspeed]``):

- **What is split.** Stage 1: AdamW's moments; stage 2: and the gradients; stage 3: and the parameters. Each
  process keeps 1/W of them. Optimizer offload (``offload_optimizer_device: cpu``) keeps the optimizer state in
  CPU memory and runs AdamW there; parameter offload (stage 3, ``offload_param_device: cpu``) the parameters.
- **Gradient convention.** rlft sums the processes' gradients (each process's loss is already divided by the
  whole mini-batch's normaliser, ``rlft.parallel.dist``); DeepSpeed averages them. Every loss is therefore multiplied by
  the number of processes before its backward (:func:`backward`), so the sharded update is the one-process one.
- **Micro-batches.** rlft forms its own (``train.micro_batch_size``, ``train.micro_batch_tokens``), so their
  number varies from one mini-batch to the next: the engine runs with ``managed_gradient_accumulation: false``
  (each backward accumulates, :func:`step` reduces and updates) and one micro-batch per "gradient accumulation
  step" in DeepSpeed's own counting. With stages 2 and 3 every backward communicates, so every process runs as
  many as the busiest (``Strategy.lockstep``, as under FSDP).
- **Clipping, skipping.** ``optim.grad_clip`` becomes DeepSpeed's ``gradient_clipping``; a step whose gradient
  norm is not finite is skipped by DeepSpeed and counted by rlft as under one process. The learning-rate schedule
  stays rlft's.
- **Generation and no-grad passes** (sampling, old log-probs, evaluation) under stage 3 run inside
  :func:`gathered`: every parameter is gathered once and the engine's per-layer hooks are off until the block
  ends, so processes may run different numbers of forward passes. Stages 1 and 2 keep whole weights in every
  process: nothing to gather.
- **Checkpoints** hold the whole policy (an ordinary Hugging Face directory) and the whole optimizer state keyed by
  parameter name, the same form as a sharded FSDP run's: a ZeRO run resumes under any number of processes,
  under ZeRO, FSDP or none.

A critic (PPO, VAPO) gets an engine of its own, with the same settings. The frozen reference (when the algorithm
has a KL term) is split too at stage 3, in an engine without an optimizer (:func:`wrap_frozen`; parameter offload
as the policy's), and gathered whole for its log-probs as the policy is for sampling; at stages 1 and 2, which
split no parameters, it stays whole in every process. Under LoRA it is the policy with its adapters off. Refused,
by key:
the vLLM sampler (as under FSDP) and a ``model.dtype`` other than float32 (the engine keeps float32 weights;
``model.autocast=bfloat16`` runs the passes in bfloat16 on a GPU).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from rlft.parallel.dist import env_flag
from rlft.parallel.strategy import MakeOptimizer, Strategy, refuse_unsharded_parts, weights_of
from rlft.parallel.zero_state import (engine_of, full_model_state, full_optimizer_state, load_model_state,
                                     load_optimizer_state, stage_of)

# keys of a DeepSpeed JSON config that rlft sets itself, accepted with the value "auto" only


_OWN_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping")


@dataclass(frozen=True)
class ZeroPlan:
    """What DeepSpeed shards, read from ``accelerate launch``'s DeepSpeed settings."""

    stage: int = 2
    """1: optimizer state split over the processes; 2: and gradients; 3: and parameters."""
    zero_optimization: dict = field(default_factory=dict)
    """The ``zero_optimization`` section handed to DeepSpeed (``stage`` and any offload included)."""

    @property
    def offload(self) -> bool:
        z = self.zero_optimization
        return any((z.get(k) or {}).get("device", "none") != "none" for k in ("offload_optimizer", "offload_param"))


def plan_from_env(env: dict[str, str] | None = None) -> ZeroPlan | None:
    """The plan of a DeepSpeed launch (``ACCELERATE_USE_DEEPSPEED``), None otherwise.

    >>> plan_from_env({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}).stage
    3
    >>> plan_from_env({}) is None
    True
    """
    env = os.environ if env is None else env
    if not env_flag("ACCELERATE_USE_DEEPSPEED", env):
        return None
    precision = env.get("ACCELERATE_MIXED_PRECISION", "no").lower()
    if precision not in ("no", "none", ""):
        raise RuntimeError(f"mixed_precision: {precision} under DeepSpeed: rlft keeps float32 weights in the engine; "
                           "set mixed_precision: 'no' and model.autocast=bfloat16 for bfloat16 passes on a GPU")
    path = env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "")
    if path:
        zero = _zero_section_of_file(Path(path))
    else:
        stage = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
        if not stage.isdigit():
            raise RuntimeError(f"zero_stage: {stage!r} is not a number (1, 2 or 3)")
        zero = {"stage": int(stage)}
        for key, name in (("offload_optimizer", "OFFLOAD_OPTIMIZER_DEVICE"), ("offload_param", "OFFLOAD_PARAM_DEVICE")):
            device = env.get(f"ACCELERATE_DEEPSPEED_{name}", "none").lower()
            if device not in ("none", "cpu"):
                raise RuntimeError(f"{name.lower()}: {device!r}; rlft offloads to 'cpu' or not at all ('none')")
            if device != "none":
                zero[key] = {"device": device}
    stage = zero.get("stage", 0)
    if stage not in (1, 2, 3):
        raise RuntimeError(f"zero_stage: {stage!r}; rlft runs ZeRO stages 1, 2 and 3 (for plain data parallelism "
                           "launch with recipes/accelerate/ddp.yaml)")
    if zero.get("offload_param") and stage != 3:
        raise RuntimeError(f"offload_param_device: parameters are offloaded at ZeRO stage 3 only "
                           f"(zero_stage is {stage})")
    return ZeroPlan(stage=stage, zero_optimization=zero)


def _zero_section_of_file(path: Path) -> dict:
    """The ``zero_optimization`` section of a DeepSpeed JSON config; refuses the sections rlft would ignore."""
    try:
        conf = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RuntimeError(f"deepspeed_config_file {path}: cannot read it as JSON: {e}") from None
    if not isinstance(conf, dict) or not isinstance(conf.get("zero_optimization"), dict):
        raise RuntimeError(f"deepspeed_config_file {path}: no 'zero_optimization' object")
    for key, value in conf.items():
        if key == "zero_optimization" or (key in _OWN_KEYS and value == "auto"):
            continue
        if key in _OWN_KEYS:
            raise RuntimeError(f"deepspeed_config_file {path}: {key!r} must be \"auto\": rlft sets it "
                               "(optim.grad_clip, train.micro_batch_size, train.micro_batch_tokens)")
        if key in ("fp16", "bf16") and not (isinstance(value, dict) and value.get("enabled") in (False, "false")):
            raise RuntimeError(f"deepspeed_config_file {path}: {key!r}: rlft keeps float32 weights in the engine; "
                               "use model.autocast=bfloat16 for bfloat16 passes on a GPU")
        if key not in ("fp16", "bf16"):
            raise RuntimeError(f"deepspeed_config_file {path}: {key!r}: rlft reads only 'zero_optimization' (and "
                               f"{', '.join(_OWN_KEYS)} as \"auto\"); the optimizer and schedule are rlft's (optim.*)")
    return dict(conf["zero_optimization"])


def check_supported(cfg, plan: ZeroPlan) -> None:
    """Refuse, naming the key, what the ZeRO path does not run (before anything is written)."""
    from rlft.config import ConfigError
    from rlft.models.loading import resolve_device

    if plan.offload and resolve_device(cfg.model.device).type == "cpu":
        raise ConfigError("offload_optimizer_device / offload_param_device: offloading moves DeepSpeed's state from "
                          "GPU to CPU memory, but this run is on the CPU: set both to none")
    if cfg.model.dtype != "float32":
        raise ConfigError(f"model.dtype: {cfg.model.dtype} under DeepSpeed: the engine keeps float32 weights; "
                          "use model.dtype=float32 with model.autocast=bfloat16")
    if cfg.algo.target_kl > 0:
        raise ConfigError("algo.target_kl: not supported under DeepSpeed: an early stop drops the gradients a "
                          "mini-batch accumulated, and the engine offers no way to drop them without its step; launch "
                          "with recipes/accelerate/ddp.yaml or fsdp.yaml, or set algo.target_kl=0")
    refuse_unsharded_parts(cfg, "a DeepSpeed launch (ACCELERATE_USE_DEEPSPEED)")


def ds_config(plan: ZeroPlan, grad_clip: float) -> dict:
    """The DeepSpeed configuration of the policy's engine."""
    return {
        "train_micro_batch_size_per_gpu": 1,  # rlft forms its micro-batches; DeepSpeed only counts them
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,  # backward accumulates, step() reduces and updates
        "gradient_clipping": float(grad_clip) if grad_clip > 0 else 0.0,
        "zero_optimization": dict(plan.zero_optimization),
        "zero_allow_untested_optimizer": True,  # rlft's torch AdamW
        "zero_force_ds_cpu_optimizer": False,  # offloaded, it runs as torch's AdamW on the CPU
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }


def wrap(model: nn.Module, optimizer: torch.optim.Optimizer, plan: ZeroPlan, grad_clip: float):
    """The DeepSpeed engine of ``model`` and ``optimizer`` (``model`` keeps answering rlft's calls; its engine is
    :func:`engine_of` it). Every process calls it."""
    import deepspeed

    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(plan, grad_clip),
                                      dist_init_required=False)
    return _attach(model, engine, plan)


def _attach(model: nn.Module, engine, plan: ZeroPlan):
    """Mark ``model`` as ``engine``'s (:func:`engine_of`, :func:`stage_of`); not as a submodule: the engine holds
    the model."""
    object.__setattr__(model, "_rlft_zero_engine", engine)
    object.__setattr__(model, "_rlft_zero_plan", plan)
    return engine


def frozen_config(plan: ZeroPlan) -> dict:
    """The DeepSpeed configuration of a frozen model's engine at stage 3: its parameters split (and offloaded, if
    the policy's are); no optimizer, so no optimizer offload."""
    zero = {k: v for k, v in plan.zero_optimization.items() if k != "offload_optimizer"}
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": zero,
            "steps_per_print": 2**62, "wall_clock_breakdown": False}


def wrap_frozen(model: nn.Module, plan: ZeroPlan):
    """At stage 3, split the parameters of a model that is never trained (the KL reference) over the processes in
    an engine without an optimizer, and return the engine; at stages 1 and 2 (no parameter is split there) leave
    the model whole and return None. Every process calls it."""
    if plan.stage < 3:
        return None
    import deepspeed

    engine, *_ = deepspeed.initialize(model=model, config=frozen_config(plan), dist_init_required=False)
    return _attach(model, engine, plan)


def _parameter_offload(engine):
    """The object that holds a stage-3 engine's gathering hooks: its ZeRO optimizer's ``parameter_offload``, or,
    in an engine without an optimizer (:func:`wrap_frozen`), the ``DeepSpeedZeRoOffload`` DeepSpeed puts in the
    optimizer's place."""
    return getattr(engine.optimizer, "parameter_offload", engine.optimizer)


def inert_hook(hook) -> bool:
    """The start- and end-of-forward hooks a DeepSpeed engine puts on its model: timers, its profiler, 16-bit input
    casts (rlft keeps DeepSpeed in float32) and, at stage 3, the flag that lets parameters be gathered during a
    forward. Neither changes a call's arithmetic; stage 3's gathering hooks are other hooks, which
    :func:`gathered` takes off while the weights are whole (and a partitioned weight is not ``_dense``)."""
    return getattr(hook, "__qualname__", "").startswith("DeepSpeedEngine._create_module_forward_")


def backward(engine, loss: torch.Tensor, world: int) -> None:
    """Back-propagate ``loss`` through the engine, summed over the processes (DeepSpeed averages: times ``world``)."""
    engine.backward(loss * world, scale_wrt_gas=False)


def step(engine) -> float:
    """Reduce the accumulated gradients, clip and update (DeepSpeed skips a non-finite gradient); the global
    gradient norm before clipping (NaN when DeepSpeed reports none)."""
    engine.step()
    norm = engine.get_global_grad_norm()
    if norm is None:
        return float("nan")
    return float(norm.item() if isinstance(norm, torch.Tensor) else norm)


@contextmanager
def gathered(model) -> Iterator[None]:
    """Under stage 3: every process holds the whole weights and the engine's hooks are off (so processes may run
    different numbers of forward passes) until the block ends; at stages 1 and 2 the weights are whole anyway."""
    engine = engine_of(model)
    if engine is None or stage_of(model) < 3:
        yield
        return
    import deepspeed

    # DeepSpeed's own unwrap_model_for_generation leaves the root's start-of-forward hook, whose trace check is a
    # collective: a process evaluating alone would wait for the others. Every hook is taken off here, and put back
    # in the order DeepSpeed registers them (the start-of-forward hook first).
    offload = _parameter_offload(engine)
    start_hook = offload.fwd_pre_hook.hooks_dict_ref()[offload.fwd_pre_hook.id]
    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
        offload._remove_module_hooks()
        offload.forward_hooks, offload.backward_hooks = [], []
        try:
            yield
        finally:
            offload.fwd_pre_hook = offload.module.register_forward_pre_hook(start_hook)
            offload._register_deepspeed_module(offload.module)


class Zero(Strategy):
    """DeepSpeed ZeRO: the policy and the critic each in an engine with their optimizer (:func:`wrap`), the frozen
    reference split at stage 3 (:func:`wrap_frozen`); the update's passes run through the engines."""

    name = "zero"

    def __init__(self, plan: ZeroPlan):
        self.plan = plan

    def check(self, cfg) -> None:
        check_supported(cfg, self.plan)
        super().check(cfg)

    def prepare(self, model, make_optimizer: MakeOptimizer | None = None, *, grad_clip: float = 0.0):
        if not isinstance(model, nn.Module):  # LoRA's reference view: its policy is in an engine already
            return None
        if make_optimizer is None:
            wrap_frozen(model, self.plan)
            return None
        optimizer = make_optimizer(model.parameters())  # on the whole parameters; the engine then splits its state
        wrap(model, optimizer, self.plan, grad_clip)
        return optimizer

    def gathered(self, model):
        return gathered(weights_of(model))

    def shards(self, model) -> bool:
        return engine_of(model) is not None

    def communicates(self, model) -> bool:
        return stage_of(model) == 3

    def runner(self, model):
        engine = engine_of(model)
        return model if engine is None else engine  # the update's passes go through the engine

    def backward(self, model, loss: torch.Tensor) -> None:
        engine = engine_of(model)
        if engine is None:
            loss.backward()
        else:
            backward(engine, loss, self.dist.world)

    def step(self, model, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
        engine = engine_of(model)
        if engine is None:
            return super().step(model, optimizer, grad_clip)
        return step(engine)  # DeepSpeed reduces, clips and steps (skipping a non-finite gradient) in its engine

    _gather_model = staticmethod(full_model_state)
    _gather_optimizer = staticmethod(full_optimizer_state)
    _load_model = staticmethod(load_model_state)
    _load_optimizer = staticmethod(load_optimizer_state)

