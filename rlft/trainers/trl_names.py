"""TRL's metric names beside rlft's own, each the quantity TRL's ``GRPOTrainer`` logs under that name.

rlft's names stay what the health rules, the report and the plots read; these are added to the same rows of
``metrics.jsonl`` so that a TRL user's dashboards and the tutorials' tables (``reward``, ``reward_std``,
``rewards/<func_name>/mean``, ``kl``, ``completions/clipped_ratio``, ...) read a run of rlft as they read a run of
TRL. The definitions follow TRL's ``GRPOTrainer`` (``_generate_and_score_completions`` and ``_compute_loss``):

* ``reward``: the mean over the samples of the total reward, the weighted sum of the reward functions where a
  function's ``None`` counts as nothing (TRL sums with ``nansum``; rlft's own total is unscorable when a weighted
  component is, so ``reward/mean`` averages the scorable totals only).
* ``reward_std``: the mean over the groups of the (unbiased) standard deviation of those totals inside the group.
* ``rewards/<name>/mean`` and ``/std``: each function's mean and unbiased standard deviation over the samples it
  scored (``None`` left out; ``std`` of fewer than 2 values is 0 here, NaN in TRL).
* ``completions/mean_length``, ``/min_length``, ``/max_length``: the completions' token counts (the EOS included);
  ``/mean_terminated_length``, ... the same over the completions that ended with EOS (0 when none did);
  ``/clipped_ratio``: the share of completions cut at the generation budget (no EOS).
* ``kl``: the mean over the loss tokens of k3, ``exp(ref - logp) - (ref - logp) - 1`` (KL(pi || ref)), whatever
  ``algo.loss_agg`` and ``algo.kl_estimator`` are (rlft's ``actor/kl_loss`` is the loss term as aggregated);
  logged only with a KL term in the loss, as TRL logs it only when ``beta`` is not 0.
* ``entropy``: the token mean of the policy's entropy in the update (rlft's ``actor/entropy``).
* ``clip_ratio/low_mean``: the share of tokens with ratio below ``1 - epsilon`` and a negative advantage,
  ``/high_mean`` above ``1 + epsilon_high`` with a positive one, ``/region_mean`` either (the two never overlap).
* ``loss``: the policy's whole loss as minimised (every term, weighted), the mean over the step's optimizer steps.
* ``grad_norm``: the policy's gradient norm before clipping; ``learning_rate``: the learning rate after the step's
  scheduler step, the one the next step uses (what Hugging Face's Trainer logs).
* ``frac_reward_zero_std``, ``num_tokens`` and ``epoch`` are rlft's own names already.

TRL averages each logged value over ``logging_steps`` steps; ``metrics.jsonl`` holds one row per RL step (the
façade's ``log_history`` averages them as TRL does).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

RENAMED = {  # TRL's name: rlft's metric of the same quantity
    "loss": "actor/loss",
    "entropy": "actor/entropy",
    "kl": "actor/ref_kl",
    "clip_ratio/low_mean": "actor/pg_clipfrac_low",
    "clip_ratio/high_mean": "actor/pg_clipfrac_high",
    "grad_norm": "actor/grad_norm",
}
"""TRL's names of quantities rlft logs under its own name, TRL's definition being rlft's."""


def reward_metrics(parts: torch.Tensor, weights: Sequence[float], names: Sequence[str],
                   group_size: int) -> dict[str, float]:
    """``reward``, ``reward_std`` and ``rewards/<name>/mean|std`` from ``parts`` (B, K): each reward function's value
    per sample (NaN: unscorable), in the order of ``names``, weighted by ``weights`` (K,); groups of ``group_size``
    contiguous samples.

    >>> parts = torch.tensor([[1.0, 0.5], [0.0, float("nan")], [1.0, 1.0], [1.0, 1.0]])
    >>> m = reward_metrics(parts, [1.0, 2.0], ["acc", "fmt"], 2)
    >>> m["reward"], round(m["reward_std"], 4), round(m["rewards/fmt/mean"], 4), m["rewards/acc/std"]
    (2.0, 0.7071, 0.8333, 0.5)
    """
    w = torch.tensor(list(weights), dtype=torch.float32)  # (K,)
    total = torch.nansum(parts.float() * w, dim=1)  # (B,) TRL: a function's None adds nothing
    out = {"reward": total.mean().item(),
           "reward_std": total.view(-1, group_size).std(dim=1).mean().item() if group_size > 1 else 0.0}
    for k, name in enumerate(names):
        col = parts[:, k].float()
        col = col[~torch.isnan(col)]  # (n,) the samples it scored
        out[f"rewards/{name}/mean"] = col.mean().item() if col.numel() else 0.0
        out[f"rewards/{name}/std"] = col.std().item() if col.numel() > 1 else 0.0
    return out


def completion_metrics(lengths: torch.Tensor, truncated: torch.Tensor) -> dict[str, float]:
    """``completions/*`` from each completion's token count ``lengths`` (B,) and whether it was cut at the
    budget ``truncated`` (B,) bool.

    >>> m = completion_metrics(torch.tensor([3, 8, 5, 8]), torch.tensor([False, True, False, True]))
    >>> m["completions/mean_length"], m["completions/clipped_ratio"], m["completions/max_terminated_length"]
    (6.0, 0.5, 5.0)
    """
    lengths = lengths.float()
    ended = lengths[~truncated.bool()]
    ended = ended if ended.numel() else torch.zeros(1)  # TRL: 0 when no completion ended
    return {"completions/mean_length": lengths.mean().item(), "completions/min_length": lengths.min().item(),
            "completions/max_length": lengths.max().item(),
            "completions/mean_terminated_length": ended.mean().item(),
            "completions/min_terminated_length": ended.min().item(),
            "completions/max_terminated_length": ended.max().item(),
            "completions/clipped_ratio": truncated.float().mean().item()}


def update_metrics(metrics: Mapping[str, float], next_lr: float | None = None) -> dict[str, float]:
    """TRL's names of the update's quantities in ``metrics`` (rlft's names, :data:`RENAMED`), with
    ``clip_ratio/region_mean`` and ``learning_rate`` (``next_lr``: the rate after the step's scheduler step)."""
    out = {trl: metrics[ours] for trl, ours in RENAMED.items() if ours in metrics}
    if "clip_ratio/low_mean" in out and "clip_ratio/high_mean" in out:  # low: A < 0, high: A > 0, never both
        out["clip_ratio/region_mean"] = out["clip_ratio/low_mean"] + out["clip_ratio/high_mean"]
    if next_lr is not None:
        out["learning_rate"] = next_lr
    return out
