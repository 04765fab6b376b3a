"""One RL step of the tiny model, in one process (``python``) or several (``accelerate launch`` / ``torchrun``).

Used by tests/test_dist.py (not collected by pytest):

    python tests/dist_worker.py OUT MODEL_DIR [key=value ...]

The main process writes ``OUT``: the step's metrics, the gradient each optimizer
step applied (after the sum over processes), the global batch the step trained
on and, in a one-process run, the per-parameter sum of |gradient terms| (the
scale of the rounding bound). Rollouts are generated one prompt at a time with
a seed drawn from the prompt's tokens, so the global batch does not depend on
how the prompts are shared between processes. With ``RLFT_PLANT=no_grad_sum``
the gradients are not summed over processes, with ``RLFT_PLANT=fsdp_mean`` a sharded run (rlft.fsdp) averages
them as FSDP does by default (planted bugs the tests must see).
"""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/numerics.py

from numerics import AbsGradSum  # noqa: E402

from rlft import dist as rdist  # noqa: E402
from rlft import run  # noqa: E402
from rlft.config import load_config  # noqa: E402
from rlft.data.templates import encode_prompts  # noqa: E402
from rlft.models.loading import load_policy  # noqa: E402
from rlft.rollout.batch import cat_batches  # noqa: E402
from rlft.trainers import rl  # noqa: E402


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

    def wrapped(*args, **kwargs):  # a sharded gradient (rlft.fsdp) is gathered whole, in every process
        grads.append({n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
                      for n, p in model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    optimizer.step = wrapped


def main(out: str, model_dir: str, overrides: list[str]) -> None:
    torch.set_num_threads(1)
    dist = rdist.init_dist("cuda" if "model.device=cuda" in overrides else "cpu")
    if os.environ.get("RLFT_PLANT") == "no_grad_sum":
        rdist.Dist.sum_grads_ = lambda self, params: None
    if os.environ.get("RLFT_PLANT") == "fsdp_mean":  # FSDP's default: the processes' gradients averaged
        from torch.distributed.fsdp import FSDPModule
        FSDPModule.set_gradient_divide_factor = lambda self, factor: None
        FSDPModule.set_force_sum_reduction_for_comms = lambda self, enable: None
    cfg = load_config(None, [f"model.path={model_dir}", *overrides])
    run.seed_everything(cfg.train.seed)
    policy, tok = load_policy(model_dir, cfg.model)
    train_ex, _ = run.load_task(cfg)
    prompts = encode_prompts(train_ex, cfg.data.template, tok, cfg.data.max_prompt_tokens, "train data")
    state = run._rl_state(policy, tok, train_ex, prompts, cfg)
    state.dist = dist
    rl.generate = per_prompt_rollout(rl.generate)
    seen: list = []
    advantages = rl.compute_advantages
    rl.compute_advantages = lambda st, batch, c: seen.append(batch) or advantages(st, batch, c)
    grads: dict[str, list] = {"policy": [], "critic": []}
    models = {"policy": policy, "critic": state.critic}
    scales = {}
    for name, opt in (("policy", state.optimizer), ("critic", state.critic_optimizer)):
        if opt is not None:
            recording(opt, models[name], grads[name])
            if dist.shard is None:  # the bound's scale comes from the one-process run
                scales[name] = AbsGradSum(models[name])
    metrics = rl.rl_step(state, cfg)
    if dist.is_main:
        batch = seen[0]
        torch.save({"world": dist.world, "metrics": metrics, "grads": grads,
                    "scale": {k: {n: s.scale(n) for n in s.total} for k, s in scales.items()},
                    "response_ids": batch.response_ids, "scores": batch.scores, "adv": batch.adv,
                    "n_tokens": batch.prompt_ids.numel() + batch.response_ids.numel()}, out)
    rdist.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
