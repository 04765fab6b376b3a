"""Sharded RL training: the policy's parameters, gradients and optimizer state split over the processes (FSDP2).

``accelerate launch`` with an FSDP configuration (``recipes/accelerate/fsdp.yaml``)
sets ``ACCELERATE_USE_FSDP`` and its ``FSDP_*`` settings; rlft then shards the
RL policy with PyTorch's ``fully_shard`` (FSDP2) instead of keeping a whole copy
per process:

- **What is sharded.** Every decoder layer (the classes the model lists in
  ``_no_split_modules``) and the rest of the model (embeddings, final norm, LM
  head) as the root group. Each process keeps 1/W of the parameters, of their
  gradients and of AdamW's two moments.
- **Gradient convention.** rlft sums the processes' gradients (each process's
  loss is already divided by the whole mini-batch's normaliser, ``rlft.parallel.dist``);
  FSDP averages by default. Every FSDP module is therefore set to divide by 1 and
  to reduce with a plain sum, so the sharded update is the one-process update.
- **Generation and no-grad passes** (sampling, old / reference log-probs,
  evaluation) run on whole weights: :func:`gathered` all-gathers every layer once
  and keeps it whole until the block ends, so processes may run different
  numbers of forward passes (their rows finish at different lengths), as in
  verl's hybrid engine. There each process holds the whole weights besides
  its shards.
- **The update** runs sharded: each forward gathers one layer at a time and
  frees it after (``FSDP_RESHARD_AFTER_FORWARD``, ZeRO-3) or keeps it until the
  backward (ZeRO-2). Every process must then run the same number of forward and
  backward passes: ``Strategy.lockstep`` says how many zero-weight passes a
  process with fewer micro-batches adds.
- **Offload.** ``FSDP_OFFLOAD_PARAMS=true`` keeps the sharded parameters,
  gradients and optimizer state in CPU memory (``CPUOffloadPolicy``) and runs
  AdamW there: in the update GPU memory holds only the layers being computed
  (generation still gathers the whole weights onto the GPU).
- **Checkpoints** hold full state dicts, gathered to the main process
  (:func:`full_model_state`, :func:`full_optimizer_state`): a sharded run's
  checkpoint is an ordinary Hugging Face directory and resumes under any number
  of processes, sharded or not.

The frozen reference (when the algorithm has a KL term) is sharded the same way
and gathered with the policy for the reference log-probs. The sharded path
refuses the vLLM sampler (:func:`check_supported`). Under LoRA the frozen base and the adapters
are sharded together (the reference is the policy with its adapters off). A critic (PPO, VAPO) is
sharded like the policy: gathered for the values of the batch, sharded in its update, saved whole.

The training loop reaches all of this through the :class:`FSDP` strategy (``rlft.parallel.strategy``); DeepSpeed
ZeRO (``rlft.parallel.zero``) is another strategy, with the same calls.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from rlft.parallel.dist import env_flag, solo
from rlft.parallel.strategy import MakeOptimizer, Strategy, clip_and_step, refuse_unsharded_parts, weights_of
from rlft.parallel.strategy import load_optimizer_state


@dataclass(frozen=True)
class ShardPlan:
    """How to shard, read from ``accelerate launch``'s FSDP settings."""

    reshard_after_forward: bool = True
    """True: each layer's whole weights are freed after its forward and gathered again for the backward (ZeRO-3,
    FULL_SHARD); False: kept until the backward (ZeRO-2, SHARD_GRAD_OP)."""
    offload: bool = False
    """Sharded parameters, gradients and optimizer state in CPU memory (FSDP_OFFLOAD_PARAMS)."""
    activation_checkpointing: bool = False
    """FSDP_ACTIVATION_CHECKPOINTING: the same as model.gradient_checkpointing=true."""


def plan_from_env(env: dict[str, str] | None = None) -> ShardPlan | None:
    """The plan of an FSDP launch (``ACCELERATE_USE_FSDP``), None otherwise.

    >>> plan_from_env({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_RESHARD_AFTER_FORWARD": "false"})
    ShardPlan(reshard_after_forward=False, offload=False, activation_checkpointing=False)
    >>> plan_from_env({}) is None
    True
    """
    env = os.environ if env is None else env
    if not env_flag("ACCELERATE_USE_FSDP", env):
        return None
    strategy = env.get("FSDP_SHARDING_STRATEGY", "").upper()  # FSDP1's name; FSDP2 configs set reshard directly
    if strategy in ("3", "NO_SHARD", "4", "HYBRID_SHARD", "5", "HYBRID_SHARD_ZERO2"):
        raise RuntimeError(f"FSDP_SHARDING_STRATEGY={strategy}: rlft shards over all processes (FULL_SHARD or "
                           "SHARD_GRAD_OP); for no sharding launch without FSDP (recipes/accelerate/ddp.yaml)")
    if "FSDP_RESHARD_AFTER_FORWARD" in env:
        reshard = env_flag("FSDP_RESHARD_AFTER_FORWARD", env)
    else:
        reshard = strategy not in ("2", "SHARD_GRAD_OP")
    return ShardPlan(reshard_after_forward=reshard,
                     offload=env_flag("FSDP_OFFLOAD_PARAMS", env),
                     activation_checkpointing=env_flag("FSDP_ACTIVATION_CHECKPOINTING", env))


def check_supported(cfg, plan: ShardPlan) -> None:
    """Refuse, naming the key, what the sharded RL path does not run (before anything is written)."""
    from rlft.config import ConfigError
    from rlft.models.loading import resolve_device

    if plan.offload and resolve_device(cfg.model.device).type == "cpu":
        raise ConfigError("FSDP_OFFLOAD_PARAMS=true (fsdp_offload_params) moves the sharded state from GPU to CPU "
                          "memory, but this run is on the CPU: set fsdp_offload_params: false")
    refuse_unsharded_parts(cfg, "an FSDP launch (ACCELERATE_USE_FSDP)")


def layer_classes(model: nn.Module) -> set[str]:
    """Class names of the model's repeated blocks: the ``_no_split_modules`` of the Hugging Face model in it (the
    model itself, or a critic's backbone)."""
    names = {n for m in model.modules() for n in (getattr(m, "_no_split_modules", None) or ())}
    if not names:
        raise RuntimeError(f"{type(model).__name__} lists no _no_split_modules: rlft cannot tell its layers to shard")
    return names


def shard_(model: nn.Module, plan: ShardPlan) -> nn.Module:
    """``model`` with each layer and then the whole of it wrapped by ``fully_shard`` (in place), set to sum the
    processes' gradients. Call before building the optimizer: the parameters become sharded tensors."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    offload = CPUOffloadPolicy() if plan.offload else OffloadPolicy()
    names = layer_classes(model)
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise RuntimeError(f"{type(model).__name__}: no module of the classes {sorted(names)} to shard")
    for layer in layers:
        fully_shard(layer, reshard_after_forward=plan.reshard_after_forward, offload_policy=offload)
    fully_shard(model, reshard_after_forward=plan.reshard_after_forward, offload_policy=offload)
    for m in fsdp_modules(model):
        m.set_gradient_divide_factor(1.0)  # rlft's losses are already normalised over the global batch
        m.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no pre-multiplied sum)
    model._rlft_shard_plan = plan  # what gathered() restores
    return model


def fsdp_modules(model: nn.Module | None) -> list:
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, nn.Module):  # None, or a view such as rlft.models.lora.AdaptersOff
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def inert_hook(hook) -> bool:
    """A forward hook of FSDP2 (``fully_shard``) whose parameters are all gathered whole (:func:`gathered`:
    unsharded, not resharded after a forward). Around a call it would then gather and free nothing, and the
    call's arithmetic is the plain module's, so the lean step may skip it."""
    fsdp_state = sys.modules.get("torch.distributed.fsdp._fully_shard._fsdp_state")
    owner = getattr(hook, "__self__", None)
    if fsdp_state is None or not isinstance(owner, fsdp_state.FSDPState):
        return False
    groups = getattr(owner, "_fsdp_param_groups", None)
    return groups is not None and all(getattr(g, "is_unsharded", False)
                                      and getattr(g, "_reshard_after_forward", True) is False for g in groups)


def is_sharded(model: nn.Module | None) -> bool:
    """Sharded over the processes by FSDP."""
    return bool(fsdp_modules(model))


def forward_communicates(model: nn.Module | None) -> bool:
    """Whether each forward call of ``model`` outside :func:`gathered` is a collective (FSDP2 and ZeRO-3 gather
    the layers' weights in it), so every process must make the same calls in the same order."""
    return bool(fsdp_modules(model))


@contextmanager
def gathered(model: nn.Module | None) -> Iterator[None]:
    """Inside the block every process holds ``model``'s whole weights (one all-gather per layer, here, in every
    process) and its forward passes communicate nothing, so processes may run different numbers of them; on exit
    the weights are sharded again. Nothing for a model that is not sharded. Not for gradients: the block is for
    generation, log-probs without gradient and evaluation. LoRA's reference (``AdaptersOff``) gathers the policy
    whose weights it runs on."""
    model = weights_of(model)
    mods = fsdp_modules(model)
    if not mods:
        yield
        return
    for m in mods:
        m.set_reshard_after_forward(False)
        m.unshard()
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
        reshard = getattr(model, "_rlft_shard_plan", ShardPlan()).reshard_after_forward
        for m in mods:
            m.set_reshard_after_forward(reshard)


def full_model_state(model: nn.Module, *, tied_once: bool = True) -> dict[str, torch.Tensor] | None:
    """The whole state dict of a sharded model, on the CPU, in the main process (None in the others); every
    process must call it. ``tied_once``: a tied weight under its first name only, as save_pretrained writes it;
    False: under every name, as ``load_state_dict`` expects it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if torch.distributed.get_rank() != 0:
        return None
    if not tied_once:
        return sd
    seen: dict[int, str] = {}  # tied weights (one parameter under two names) are written once, as save_pretrained does
    for name, p in model.named_parameters(remove_duplicate=False):
        if seen.setdefault(id(p), name) != name:
            sd.pop(name, None)
    return sd


def load_model_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a whole state dict into ``model``, sharded (each process keeps its part) or not."""
    if not is_sharded(model):
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
    """The whole optimizer state of a sharded model, keyed by parameter name, in the main process (None in the
    others); every process must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    sd = get_optimizer_state_dict(model, optimizer,
                                  options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return sd if torch.distributed.get_rank() == 0 else None


class FSDP(Strategy):
    """FSDP2: every layer and the root of each trained or frozen model sharded over the processes
    (:func:`shard_`), gathered whole for sampling and no-grad passes (:func:`gathered`), saved whole."""

    name = "fsdp"

    def __init__(self, plan: ShardPlan):
        self.plan = plan

    @property
    def activation_checkpointing(self) -> bool:
        return self.plan.activation_checkpointing and not solo()  # not for what the main process runs alone

    def check(self, cfg) -> None:
        check_supported(cfg, self.plan)
        super().check(cfg)

    def prepare(self, model, make_optimizer: MakeOptimizer | None = None, *, grad_clip: float = 0.0):
        if isinstance(model, nn.Module):  # not LoRA's reference view: the policy it runs on is sharded already
            shard_(model, self.plan)  # before the optimizer: its parameters become sharded tensors
        return super().prepare(model, make_optimizer, grad_clip=grad_clip)

    def gathered(self, model):
        return gathered(model)

    def shards(self, model) -> bool:
        return is_sharded(model)

    def communicates(self, model) -> bool:
        return forward_communicates(model)

    def step(self, model, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
        if not self.shards(model):  # a sharded model's gradients were summed by FSDP in the backward
            self.dist.sum_grads_(model.parameters())
        return clip_and_step(model, optimizer, grad_clip)

    _gather_model = staticmethod(full_model_state)
    _gather_optimizer = staticmethod(full_optimizer_state)
    _load_model = staticmethod(load_model_state)
    _load_optimizer = staticmethod(load_optimizer_state)  # torch.distributed.checkpoint loads into FSDP too
