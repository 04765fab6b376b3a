"""One RL step of the tiny model, in one process (``python``) or several (``accelerate launch`` / ``torchrun``).

Used by tests/test_dist.py (not collected by pytest):

    python tests/dist_worker.py OUT MODEL_DIR [key=value ...]
    python tests/dist_worker.py --jobs JOBS.json

The second form runs several steps in turn in one launch (a process group's start costs more than a tiny step):
JOBS.json is a list of ``{"out": OUT, "model": MODEL_DIR, "overrides": [...], "env": {NAME: VALUE}}``, each job
run with its ``env`` set over the launch's environment (the settings below, and the launch's FSDP and DeepSpeed
variables) and with nothing it patched left for the next.

For each job the main process writes ``OUT``: the step's metrics, the gradient each optimizer
step applied (after the sum over processes), the global batch the step trained
on and, in a one-process run, the per-parameter sum of |gradient terms| (the
scale of the rounding bound). Rollouts are generated one prompt at a time with
a seed drawn from the prompt's tokens, so the global batch does not depend on
how the prompts are shared between processes. Unsharded and under DeepSpeed (rlft.parallel.zero) it also writes the
policy's weights and its optimizer state (keyed by parameter name) after the step, whole, and under DeepSpeed that
state once more after loading it back into the partitions. With ``RLFT_CHECK=fresh_load`` it runs no step: it loads a synthetic
whole optimizer state into the fresh (sharded) optimizer, as a resume does, and writes it with what gathers back
(``fresh_load_by_position``: the same state keyed by position, as a plain run's checkpoint holds it). A run with a
KL reference writes how many of its parameter elements this process holds and, where it is sharded, the reference
gathered whole before the step, and for each rollout whether its decode steps ran through the lean step.
With ``RLFT_PLANT=no_grad_sum`` the gradients are not summed over processes, with ``RLFT_PLANT=fsdp_mean`` a
sharded run (rlft.parallel.fsdp) averages them as FSDP does by default, with ``RLFT_PLANT=zero_mean`` a DeepSpeed run
(rlft.parallel.zero) as DeepSpeed does (planted bugs the tests must see). With ``lora.rank`` the policy gets its adapters
as ``rlft train`` adds them.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import zlib
from contextlib import ExitStack
from pathlib import Path
from unittest.mock import patch

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/numerics.py

from numerics import AbsGradSum  # noqa: E402

from rlft.parallel import dist as rdist  # noqa: E402
from rlft.data.task import load_task  # noqa: E402
from rlft.runs.start import seed_everything  # noqa: E402
from rlft.trainers.policy import training_policy  # noqa: E402
from rlft.trainers.rl_setup import build_rl_state  # noqa: E402
from rlft.recipe import load_config  # noqa: E402
from rlft.data.templates import encode_prompts  # noqa: E402
from rlft.parallel import launch  # noqa: E402
from rlft.parallel.strategy import Strategy  # noqa: E402
from rlft.models.loading import load_policy  # noqa: E402
from rlft.rollout.batch import cat_batches  # noqa: E402
from rlft.rollout.lean import LeanDecoder  # noqa: E402
from rlft.trainers import rl  # noqa: E402
from rlft.parallel.zero import engine_of, stage_of  # noqa: E402


def char_codes(completion: str, sample) -> float:
    """A reward that differs between the random texts of an untrained model: the mean character code / 100."""
    return sum(map(ord, completion)) / (100 * max(len(completion), 1))


def per_prompt_rollout(real):
    """``generate`` one prompt at a time, each seeded by its tokens: the same rows in any process layout."""

    def generate(policy, tokenizer, prompts, *, group_size, **kwargs):
        parts = []
        for p in prompts:
            torch.manual_seed(zlib.crc32(repr(p).encode()))
            parts.append(real(policy, tokenizer, [p], group_size=group_size, **kwargs))
        return cat_batches(parts)

    return generate


def recording(optimizer, model, grads: list[dict]):
    """Wrap ``optimizer.step`` to keep the gradients it applies to ``model``, by parameter name."""
    step = optimizer.step

    def wrapped(*args, **kwargs):  # a sharded gradient (rlft.parallel.fsdp) is gathered whole, in every process
        if engine_of(model) is not None:
            grads.append(zero_grads(model, optimizer))
        else:
            grads.append({n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
                          for n, p in model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    optimizer.step = wrapped


def zero_grads(model, optimizer) -> dict:
    """The whole gradient a DeepSpeed ZeRO engine (rlft.parallel.zero) hands its optimizer, by parameter name, read inside
    the optimizer's step (after the reduction over processes). Stage 3: DeepSpeed's ``safe_get_full_grad``; stages
    1 and 2: each group's flat partition, gathered from every process and cut at the group's parameters (in order,
    padding at the end)."""
    engine = engine_of(model)
    if stage_of(model) == 3:
        from deepspeed.utils import safe_get_full_grad
        return {n: safe_get_full_grad(p).detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for group, params in zip(optimizer.param_groups, engine.optimizer.bit16_groups):
        part = group["params"][0].grad
        parts = [torch.empty_like(part) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(parts, part)
        flat, offset = torch.cat(parts), 0
        for p in params:
            out[names[id(p)]] = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
    return out


def held_numel(model) -> int:
    """How many of ``model``'s parameter elements this process holds: a DeepSpeed stage-3 parameter its partition
    (``ds_tensor``), an FSDP one its local shard, any other all of it."""
    total = 0
    for p in model.parameters():
        if hasattr(p, "ds_tensor"):
            total += p.ds_tensor.numel()
        elif hasattr(p, "to_local"):
            total += p.to_local().numel()
        else:
            total += p.numel()
    return total


def synthetic_optimizer_state(model) -> dict:
    """A whole AdamW state keyed by parameter name, the same in every process: moments drawn from a fixed seed."""
    g = torch.Generator().manual_seed(7)
    shapes = {n: getattr(p, "ds_shape", p.shape) for n, p in model.named_parameters()}  # ZeRO-3: the whole shape
    state = {n: {"step": torch.tensor(3.0), "exp_avg": torch.randn(shape, generator=g),
                 "exp_avg_sq": torch.rand(shape, generator=g)} for n, shape in shapes.items()}
    return {"state": state, "param_groups": [{"lr": 1e-5, "params": list(state)}]}


def planted(stack: ExitStack) -> None:
    """The bug ``RLFT_PLANT`` names, patched in until ``stack`` closes."""
    bug = os.environ.get("RLFT_PLANT")
    if bug == "no_grad_sum":
        stack.enter_context(patch.object(rdist.Dist, "sum_grads_", lambda self, params: None))
    if bug == "zero_mean":  # DeepSpeed's own convention: the processes' gradients averaged
        from rlft.parallel import zero
        stack.enter_context(patch.object(zero, "backward",
                                         lambda engine, loss, world: engine.backward(loss, scale_wrt_gas=False)))
    if bug == "fsdp_mean":  # FSDP's default: the processes' gradients averaged
        from torch.distributed.fsdp import FSDPModule
        stack.enter_context(patch.object(FSDPModule, "set_gradient_divide_factor", lambda self, factor: None))
        stack.enter_context(patch.object(FSDPModule, "set_force_sum_reduction_for_comms", lambda self, enable: None))


def step(out: str, model_dir: str, overrides: list[str], stack: ExitStack) -> None:
    """One job: the step (or the ``RLFT_CHECK``) of ``overrides`` on ``model_dir``, written to ``out``; what it
    patches is patched until ``stack`` closes."""
    strategy = launch.init("cuda" if "model.device=cuda" in overrides else "cpu")
    dist = strategy.dist
    planted(stack)
    if os.environ.get("RLFT_CALL_TOKENS"):  # the shared-prefix forward splits runs of similar lengths this eagerly
        from rlft.models import forward
        stack.enter_context(patch.object(forward, "CALL_TOKENS", int(os.environ["RLFT_CALL_TOKENS"])))
    cfg = load_config(None, [f"model.path={model_dir}", *overrides])
    seed_everything(cfg.train.seed)
    if cfg.lora.rank:  # adapters on the model, as rlft train adds them
        policy, tok = training_policy(cfg, model_dir, None, Path(out).parent)
    else:
        policy, tok = load_policy(model_dir, cfg.model)
    train_ex, _ = load_task(cfg)
    prompts = encode_prompts(train_ex, cfg.data.template, tok, cfg.data.max_prompt_tokens, "train data")
    state = build_rl_state(policy, tok, train_ex, prompts, cfg)
    state.dist = dist
    if os.environ.get("RLFT_CHECK", "").startswith("fresh_load"):  # a resume's load into a fresh engine: no step
        loaded = synthetic_optimizer_state(policy)
        given = loaded
        if os.environ["RLFT_CHECK"] == "fresh_load_by_position":  # as a plain run's optimizer.state_dict() holds it
            names = list(loaded["state"])
            given = {"state": {i: loaded["state"][n] for i, n in enumerate(names)},
                     "param_groups": [{"lr": 1e-5, "params": list(range(len(names)))}]}
        strategy.load_state(policy, optimizer=state.optimizer, optim_state=given)
        gathered = strategy.whole_state(policy, state.optimizer)[1]
        if dist.is_main:
            torch.save({"loaded": loaded, "gathered": gathered}, out)
        return
    stack.enter_context(patch.object(rl, "generate", per_prompt_rollout(rl.generate)))
    lean_built: list[bool] = []  # per rollout: whether the sampler's decode steps ran through the lean step
    build = LeanDecoder.build

    def recorded_build(model, capacity, **kwargs):
        lean = build(model, capacity, **kwargs)
        lean_built.append(lean is not None)
        return lean

    stack.enter_context(patch.object(LeanDecoder, "build", recorded_build))
    runs: list[tuple[int, int]] = []  # a sharded update's response runs per pass: (this process's, agreed)
    agreed = Strategy.agreed
    extra = int(os.environ.get("RLFT_AGREE_EXTRA", "0"))  # every process agrees on that many runs more: idle calls

    def recorded_agreement(self, model):
        agree = agreed(self, model)
        return None if agree is None else lambda n: runs.append((n, agree(n) + extra)) or runs[-1][1]

    stack.enter_context(patch.object(Strategy, "agreed", recorded_agreement))
    seen: list = []
    advantages = rl.compute_advantages
    stack.enter_context(patch.object(rl, "compute_advantages",
                                     lambda st, batch, c: seen.append(batch) or advantages(st, batch, c)))
    grads: dict[str, list] = {"policy": [], "critic": []}
    models = {"policy": policy, "critic": state.critic}
    scales = {}
    for name, opt in (("policy", state.optimizer), ("critic", state.critic_optimizer)):
        if opt is not None:
            recording(opt, models[name], grads[name])
            if dist.shard is None and dist.zero is None:  # the bound's scale comes from the one-process run
                scales[name] = AbsGradSum(models[name])
    ref_whole = None  # the reference, gathered whole before the step, and how much of it this process holds
    if strategy.shards(state.ref):
        ref_whole, _ = strategy.whole_state(state.ref, tied_once=False)
    ref_held = held_numel(state.ref) if isinstance(state.ref, torch.nn.Module) else None
    metrics = rl.rl_step(state, cfg)
    weights = optimizer = reloaded = None
    if dist.zero is not None:  # whole states, gathered by every process into the main one (FSDP's: the e2e test)
        weights, optimizer = strategy.whole_state(policy, state.optimizer)
        # loaded back as a resume loads it (every process reads the whole state), then gathered again
        strategy.load_state(policy, optimizer=state.optimizer, optim_state=dist.broadcast(optimizer))
        reloaded = strategy.whole_state(policy, state.optimizer)[1]
    elif not strategy.shards(policy):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        weights = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        optimizer = get_optimizer_state_dict(policy, state.optimizer, options=StateDictOptions(full_state_dict=True))
    runs_everywhere = dist.gather(runs)
    if dist.is_main:
        batch = seen[0]
        torch.save({"world": dist.world, "metrics": metrics, "grads": grads, "weights": weights, "optimizer": optimizer,
                    "reloaded_optimizer": reloaded, "ref_whole": ref_whole, "ref_held": ref_held,
                    "lean_built": lean_built, "runs": runs_everywhere,
                    "scale": {k: {n: s.scale(n) for n in s.total} for k, s in scales.items()},
                    "response_ids": batch.response_ids, "scores": batch.scores, "adv": batch.adv,
                    "n_tokens": batch.prompt_ids.numel() + batch.response_ids.numel()}, out)


def main(jobs: list[dict]) -> None:
    """Each job in turn, with its ``env`` set over this process's environment, in one process group: every job
    reads its launch settings afresh (``init_dist``), and what a job patched is undone before the next."""
    torch.set_num_threads(1)
    for i, job in enumerate(jobs):
        if i:  # after every process finished the last job: this one's settings are its own (the group stays open)
            if torch.distributed.is_initialized():
                torch.distributed.barrier()
            rdist._DIST = None
            launch.reset()
            gc.collect()
        with ExitStack() as stack:
            stack.enter_context(patch.dict(os.environ, job.get("env", {})))
            step(job["out"], job["model"], job["overrides"], stack)
    rdist.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "--jobs":
        main(json.loads(Path(sys.argv[2]).read_text()))
    else:
        main([{"out": sys.argv[1], "model": sys.argv[2], "overrides": sys.argv[3:]}])
    rdist.leave(0)
