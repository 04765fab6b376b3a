"""The ``Strategy``: this process among the others, and how a model trains across them.

Trainers, stages and samplers ask the run's strategy (``rlft.parallel.launch.strategy()``), never a backend:

- ``prepare(model, make_optimizer, grad_clip=)`` places a model (and builds its optimizer) in the backend's order;
- ``gathered(model)`` holds its whole weights for sampling, no-grad passes and evaluation;
- ``shards(model)``, ``communicates(model)``: whether its weights are split, whether each forward is a collective;
- ``runner(model)`` is what the update's passes call; ``lockstep(model, n)`` how many idle passes this process adds
  so that every process runs as many as the busiest; ``agreed(model)`` the count every process agrees on;
- ``backward(model, loss)``, ``step(model, optimizer, grad_clip)``: gradients summed over the processes, clipped,
  applied (a non-finite norm skips the step); ``discard(model, optimizer)`` drops them without a step;
- ``whole_state(model, optimizer)``, ``load_state(model, state, optimizer, optim_state)``: checkpoints hold whole
  state dicts, so a run resumes under any number of processes and any strategy.

This base class is the plain launch: one process, or W processes that each hold the whole model, compute their
share of every mini-batch and sum their gradients before the step (data-parallel; each process's loss is already
divided by the whole mini-batch's normaliser, so the sum is the one-process gradient). FSDP2
(``rlft.parallel.fsdp.FSDP``) and DeepSpeed ZeRO (``rlft.parallel.zero.Zero``) are subclasses.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import nn

from rlft.models.lora import AdaptersOff
from rlft.parallel.dist import Dist, current

MakeOptimizer = Callable[[object], torch.optim.Optimizer]  # the model's parameters -> its optimizer


class Strategy:
    name = "plain"
    activation_checkpointing = False  # the launch asks for activation checkpointing (as model.gradient_checkpointing)

    @property
    def dist(self) -> Dist:
        """This process among the others (the one-process ``Dist`` while the main process runs something alone)."""
        return current()

    def check(self, cfg) -> None:
        """Refuse, naming the key, what this launch cannot run (before anything is written)."""
        from rlft.config import ConfigError

        world = self.dist.world
        if cfg.train.prompts_per_step < world:
            raise ConfigError(f"train.prompts_per_step: {cfg.train.prompts_per_step} prompts cannot be shared by "
                              f"{world} processes; use at least one per process")

    def prepare(self, model, make_optimizer: MakeOptimizer | None = None, *,
                grad_clip: float = 0.0) -> torch.optim.Optimizer | None:
        """Place ``model`` (a frozen one when ``make_optimizer`` is None) and return its optimizer, built from its
        parameters as placed. Every process calls it, in the same order for the same models."""
        return make_optimizer(model.parameters()) if make_optimizer is not None else None

    def gathered(self, model) -> contextlib.AbstractContextManager:
        """Inside the block ``model``'s whole weights are in every process and its forward passes communicate
        nothing (so processes may run different numbers of them); not for gradients. LoRA's reference
        (``AdaptersOff``) gathers the policy whose weights it runs on."""
        return contextlib.nullcontext()

    def shards(self, model) -> bool:
        """Whether ``model``'s weights are split over the processes."""
        return False

    def communicates(self, model) -> bool:
        """Whether each forward call of ``model`` outside ``gathered`` is a collective, so every process must make
        the same calls in the same order."""
        return False

    def runner(self, model):
        """What the update's forward passes call for ``model``."""
        return model

    def agreed(self, model) -> Callable[[int], int] | None:
        """For a model whose forward communicates: a count every process agrees on (the largest of theirs),
        ``rlft.models.forward``'s ``agree``; None otherwise."""
        return agreed_count(self.dist) if self.communicates(model) else None

    def lockstep(self, model, n_own: int) -> int:
        """How many idle forward+backward passes (``idle_loss``) this process adds to its ``n_own`` so that every
        process runs as many as the busiest (a sharded model communicates in each)."""
        return agreed_count(self.dist)(n_own) - n_own if self.shards(model) else 0

    def backward(self, model, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, model, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
        """Sum the gradients over the processes, clip to ``grad_clip`` (0: no clipping), step unless the norm is
        not finite, clear the gradients; returns the global norm before clipping."""
        self.dist.sum_grads_(model.parameters())
        return clip_and_step(model, optimizer, grad_clip)

    def discard(self, model, optimizer: torch.optim.Optimizer) -> None:
        """Drop the gradients accumulated since the last step without stepping (``algo.target_kl``'s early stop);
        every process calls it, or none does."""
        optimizer.zero_grad(set_to_none=True)

    def whole_state(self, model, optimizer: torch.optim.Optimizer | None = None, *,
                    tied_once: bool = True) -> tuple[dict | None, dict | None]:
        """(model state, optimizer state) gathered whole into the main process, for a model whose weights are
        split (every process calls it; the others get None); (None, None) otherwise: its own state dicts are
        whole already. A subclass that splits models names its gatherers ``_gather_model(model, tied_once=)``
        and ``_gather_optimizer(model, optimizer)``."""
        if not self.shards(model):
            return None, None
        whole = self._gather_model(model, tied_once=tied_once)
        return whole, (self._gather_optimizer(model, optimizer) if optimizer is not None else None)

    def load_state(self, model, state: dict | None = None, optimizer: torch.optim.Optimizer | None = None,
                   optim_state: dict | None = None) -> None:
        """Load a whole model state and/or a saved optimizer state: keyed by index (``optimizer.state_dict()``) or
        by parameter name (a sharded run's whole state). A model whose weights are split loads through the
        subclass's ``_load_model(model, state)`` and ``_load_optimizer(model, optimizer, state)``."""
        split = self.shards(model)
        if state is not None:
            self._load_model(model, state) if split else model.load_state_dict(state)
        if optim_state is not None:
            (self._load_optimizer if split else load_optimizer_state)(model, optimizer, optim_state)


def clip_and_step(model, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    """Clip the (summed) gradients to ``grad_clip`` (0: no clipping), step unless their norm is not finite, clear
    them; returns the global norm before clipping."""
    clip = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    if hasattr(grad_norm, "full_tensor"):  # sharded gradients: the norm is a DTensor holding the global norm
        grad_norm = grad_norm.full_tensor()
    if torch.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm.item()


def weights_of(model):
    """The module whose weights ``model`` runs on: LoRA's reference view (``AdaptersOff``) runs on its policy's."""
    return model.policy if isinstance(model, AdaptersOff) else model


def agreed_count(dist: Dist) -> Callable[[int], int]:
    """A count every process agrees on, the largest: maps this process's count (of passes, or of the response runs
    of a forward, ``rlft.models.forward.response_logits``' ``agree``) to the largest over the processes. Every
    process calls it at the same point."""
    return lambda n: max(dist.gather(n))


def lockstep_extra(dist: Dist, n_own: int) -> int:
    """How many zero-weight forward+backward passes this process adds so that every process runs as many as the
    busiest one."""
    return agreed_count(dist)(n_own) - n_own


def idle_loss(loss: torch.Tensor) -> torch.Tensor:
    """``loss`` times 0: its backward runs a sharded model's communication and changes no gradient."""
    return loss * 0.0


def is_name_keyed(state: dict) -> bool:
    """Whether an optimizer state is keyed by parameter name (torch.distributed.checkpoint's whole form) rather
    than by index (``optimizer.state_dict()``)."""
    keys = list(state.get("state", {}))
    return bool(keys) and isinstance(keys[0], str)


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a saved optimizer state into ``optimizer``: a whole state keyed by parameter name (a sharded run's
    checkpoint) into a sharded (FSDP) or a plain model, or a plain ``optimizer.state_dict()`` into a plain one."""
    if not is_name_keyed(state):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def refuse_unsharded_parts(cfg, launch: str) -> None:
    """Refuse, naming the key, what a sharded launch (FSDP or DeepSpeed ZeRO) does not run."""
    from rlft.config import ConfigError

    refused = [(cfg.rollout.sampler == "vllm", "rollout.sampler",
                "each process pushes its whole policy to its own vLLM engine; launch with recipes/accelerate/ddp.yaml"),
               (cfg.algo.ref_refresh_every > 0, "algo.ref_refresh_every",
                "the reference's split weights are not copied from the policy's; launch with recipes/accelerate/ddp.yaml "
                "or set algo.ref_refresh_every=0")]
    for bad, key, why in refused:
        if bad:
            raise ConfigError(f"{key}: not supported with {launch}: {why}")
