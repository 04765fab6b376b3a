"""The launch: which strategy this run trains with, read once from the launcher's environment.

``accelerate launch`` with an FSDP configuration gives :class:`~rlft.parallel.fsdp.FSDP`, with a DeepSpeed one
:class:`~rlft.parallel.zero.Zero`; ``torchrun`` / ``accelerate launch --multi_gpu`` without either, or a plain
``rlft train``, the data-parallel :class:`~rlft.parallel.strategy.Strategy` (one process or several).
"""

from __future__ import annotations

from rlft.config.extras import require
from rlft.models.loading import check_device, device_report
from rlft.parallel import fsdp, zero
from rlft.parallel import dist
from rlft.parallel.dist import env_flag
from rlft.parallel.strategy import Strategy

_STRATEGY: Strategy | None = None


def init(device: str = "auto", echo=None) -> Strategy:
    """This run's strategy, set up once (with the process group it needs): ``device`` is ``model.device``. A
    device the installed torch cannot use, or a DeepSpeed launch without deepspeed, is a one-line ConfigError
    first; ``echo`` (the main process's) is told the device chosen (``rlft.models.loading.device_report``)."""
    global _STRATEGY
    check_device(device)
    if _STRATEGY is None or not dist.set_up():  # never read, or the process group was shut down since
        plan, zero_plan = fsdp.plan_from_env(), zero.plan_from_env()
        if zero_plan is not None:
            require("deepspeed", "accelerate launch with a DeepSpeed configuration")
        dist.init_dist(device, shard=plan, zero=zero_plan)
        _STRATEGY = fsdp.FSDP(plan) if plan is not None else zero.Zero(zero_plan) if zero_plan is not None \
            else Strategy()
    if echo is not None and _STRATEGY.dist.is_main:
        for line in device_report(device):
            echo(f"rlft: {line}")
    return _STRATEGY


def strategy() -> Strategy:
    """The run's strategy; the plain one where no launch was set up (``rlft eval``, a test, a library call)."""
    return _STRATEGY if _STRATEGY is not None else _PLAIN


def reset() -> None:
    """Forget the launch (the process group stays as ``rlft.parallel.dist`` has it): the next ``init`` reads the
    environment again."""
    global _STRATEGY
    _STRATEGY = None


def splits_models(env=None) -> bool:
    """Whether the launcher (``env``: this process's environment by default) asked for a strategy that splits
    the models over the processes (FSDP or DeepSpeed ZeRO), read before any is set up."""
    return env_flag("ACCELERATE_USE_FSDP", env) or env_flag("ACCELERATE_USE_DEEPSPEED", env)


def inert_hook(hook) -> bool:
    """Whether a forward hook is a backend's that neither changes a call's arithmetic nor communicates: FSDP2's on
    gathered weights, a DeepSpeed engine's own (the lean decode step, which calls no hook, may then run)."""
    return fsdp.inert_hook(hook) or zero.inert_hook(hook)


_PLAIN = Strategy()
