"""Whole state dicts of models in DeepSpeed ZeRO engines (``rlft.parallel.zero``): the policy, the critic and their
optimizer states gathered into the main process for a checkpoint, keyed by parameter name as a sharded FSDP run's
are, and loaded back into an engine, so a run resumes under any number of processes and any strategy."""

from __future__ import annotations

import torch
from torch import nn

from rlft.parallel.strategy import is_name_keyed


def engine_of(model) -> object | None:
    """The DeepSpeed engine wrapping ``model`` (:func:`wrap`), None for any other model."""
    return getattr(model, "__dict__", {}).get("_rlft_zero_engine")


def stage_of(model) -> int:
    plan = getattr(model, "__dict__", {}).get("_rlft_zero_plan")
    return plan.stage if plan is not None else 0


_MOMENTS = ("exp_avg", "exp_avg_sq")


def full_model_state(model: nn.Module, *, tied_once: bool = True) -> dict[str, torch.Tensor] | None:
    """The whole state dict on the CPU, in the main process (None in the others; every process must call it);
    ``tied_once``: a tied weight under its first name only, as save_pretrained writes it."""
    if stage_of(model) == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
            sd = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()} \
                if torch.distributed.get_rank() == 0 else None
    else:
        sd = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()} \
            if torch.distributed.get_rank() == 0 else None
    if sd is None or not tied_once:
        return sd
    seen: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if seen.setdefault(id(p), name) != name:
            sd.pop(name, None)
    return sd


def load_model_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a whole state dict into the engine's model, in every process (stage 3: the main process's copy,
    broadcast into the partitions), then into DeepSpeed's float32 master copies of the weights, where it has any."""
    if stage_of(model) == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
            if torch.distributed.get_rank() == 0:
                model.load_state_dict(state)
    else:
        model.load_state_dict(state)
    optimizer = engine_of(model).optimizer
    if hasattr(optimizer, "refresh_fp32_params"):  # a frozen engine (wrap_frozen) keeps no float32 copies
        optimizer.refresh_fp32_params()


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
    """AdamW's whole state keyed by parameter name (torch.distributed.checkpoint's full form, as a sharded FSDP
    run writes it), in the main process (None in the others); every process must call it."""
    from deepspeed.utils import safe_get_full_optimizer_state

    steps = [s["step"] for s in optimizer.state.values() if "step" in s]
    step = torch.as_tensor(steps[0], dtype=torch.float32).detach().cpu().clone() if steps else None
    state: dict[str, dict] = {}
    names = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        names.append(name)
        moments = {k: safe_get_full_optimizer_state(p, k) for k in _MOMENTS} if step is not None else {}
        if step is not None:
            state[name] = {"step": step.clone(), **{k: v.detach().float().cpu().clone() for k, v in moments.items()}}
    if torch.distributed.get_rank() != 0:
        return None
    group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    return {"state": state, "param_groups": [{**group, "params": names}]}


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Load a whole optimizer state into the engine's partitions, in every process: keyed by parameter name
    (:func:`full_optimizer_state`, a sharded FSDP run's) or by position (a plain run's ``optimizer.state_dict()``)."""
    from deepspeed.utils import safe_set_full_optimizer_state


    names = [n for n, p in model.named_parameters() if p.requires_grad]  # the optimizer's order (make_optimizer)
    if saved.get("state") and not is_name_keyed(saved):  # a plain run's optimizer.state_dict(): keyed by position
        saved = {"state": {names[i]: v for i, v in saved["state"].items()},
                 "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in saved["param_groups"]]}
    own = {k: v for k, v in saved["param_groups"][0].items() if k != "params"}
    for group in optimizer.param_groups:
        group.update({k: v for k, v in own.items() if k in group})
    if not saved.get("state"):
        return
    step = next(iter(saved["state"].values()))["step"]
    group = optimizer.param_groups[0]
    # AdamW's state of each flat partition, created as its first step would create it (DeepSpeed's setters fill
    # existing state only); stage 3 hands its partitions to the optimizer only while it steps
    zopt = engine_of(model).optimizer
    partitions = getattr(zopt, "fp32_partitioned_groups_flat", None) or \
        [p for g in optimizer.param_groups for p in g["params"]]
    for p in partitions:
        where = p.device if group.get("fused") or group.get("capturable") else torch.device("cpu")
        optimizer.state[p] = {"step": torch.as_tensor(step, dtype=torch.float32, device=where).clone(),
                              **{k: torch.zeros_like(p, memory_format=torch.preserve_format) for k in _MOMENTS}}
    if stage_of(model) < 3:  # stages 1 and 2 map each parameter to its fragment of that state when it first steps
        zopt._hp_optimizer_states_linked = False
        zopt._lazy_init_hp_params_optimizer_state()
    for name, p in model.named_parameters():
        if p.requires_grad:
            for k in _MOMENTS:
                value = saved["state"][name][k].to(p.device)
                if stage_of(model) == 3:
                    _set_stage3_partition(engine_of(model).optimizer, p, value, k)
                else:
                    safe_set_full_optimizer_state(p, value, k)


def _set_stage3_partition(z3, p: nn.Parameter, value: torch.Tensor, key: str) -> None:
    """Write this process's partition of ``value`` into ``key`` of ``p``'s stage-3 optimizer state: the slice the
    public setter (``safe_set_full_optimizer_state``) would write, with the zero padding of the last partition when
    the size does not divide by the number of processes (which that setter cannot cut, DeepSpeed 0.19)."""
    part, _ = z3._get_fp32_opt_state_partition(p, release_swap_buffers=False, optim_state_key=key)
    start = part.numel() * z3._get_param_partition_rank(p)
    flat = value.flatten()
    flat = torch.nn.functional.pad(flat, (0, max(0, start + part.numel() - flat.numel())))
    part.data.copy_(flat.narrow(0, start, part.numel()))
