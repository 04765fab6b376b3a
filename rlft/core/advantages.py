"""Advantage estimators: group baselines over outcome rewards, and token-level returns.

Every registered estimator has one signature::

    fn(inp: AdvantageInputs, cfg) -> tuple[Tensor, Tensor]   # (adv (B, T), ret (B, T))

``cfg`` is duck-typed (``rlft.config.AlgoConfig``): ``adv_eps``, ``gamma``,
``lam``, ``lam_critic``, ``length_alpha``, ``baseline``, ``whiten_adv``.  B = P * G
sequences, groups contiguous (``scores.view(P, G)``), T response tokens.

Conventions (fixed here, tested in ``tests/test_advantages.py``):

* **NaN score = unscorable.**  Group estimators exclude it from its group's
  statistics (mean, std, leave-one-out baseline); token-level estimators
  (``gae``, ``reinforce``, ``reinforce_pp``) exclude it from every batch
  statistic (whitening, ``batch_mean`` baseline).  Its advantage is 0 at every
  token; its ``ret`` is its ``values`` for ``gae`` (a zero critic error) and 0
  otherwise.  A sequence with no valid token is treated the same way by the
  token-level estimators (no token can carry its reward).
* **Std is the unbiased sample std (Bessel, divide by n - 1)**, as
  ``torch.std``.  GRPO on ``[1, 0, 0, 1]`` gives ``±0.5 / 0.5774 = ±0.866``.
* **Degenerate groups give 0.**  A group whose valid rewards are all equal
  (including groups with fewer than 2 valid samples) gets advantage exactly 0.
  ``adv_eps`` is added to the group std: ``(r - mean) / (std + eps)``.
* **Outcome reward of the group estimators** is ``score + sum_t token_rewards_t``
  over valid tokens (KL-in-reward, as OpenRLHF's RLOO).  The sequence advantage
  is broadcast over valid tokens and ``ret = adv`` (verl's outcome convention).
* **reinforce_pp_baseline** is ``group_mean`` of that outcome reward, broadcast
  over valid tokens, then whitened over all valid tokens of the scorable
  sequences (see :func:`reinforce_pp_baseline` for where it differs from verl).
  Its ``ret`` is the outcome reward itself (before centring and whitening) at
  every valid token, 0 for an unscorable sequence.
* **Token reward of the token-level estimators** is ``token_rewards_t``, plus
  the score at the last valid token (PPO-RLHF, Ziegler et al. 2019 eq. 2).
* **Invalid positions are skipped, as if removed.**  Rewards and values there are
  never read (junk, NaN or inf change nothing); the backward recursion carries
  over them (verl's convention for masked observation tokens); V = 0 after the
  last valid token.  ``adv`` and ``ret`` are 0 there.
* **Whitening** (``gae`` with ``whiten_adv``, ``reinforce_pp``, ``reinforce_pp_baseline``) is
  ``ops.masked_whiten`` over all valid tokens of the scorable sequences of the
  batch: ``(x - mean) / sqrt(var + 1e-8)``, unbiased var.
* **batch_mean baseline** is the mean of the sequence returns G_0 (at the first
  valid token) over scorable sequences; see :func:`mean_return`.
* **Process supervision** (``process``, DeepSeekMath §4.1.3) reads step rewards:
  ``step_rewards`` (B, T) holds a step's reward at the response token where the
  step ends and ``step_mask`` (B, T) marks those tokens.  A step counts when its
  token is valid, its reward is not NaN (NaN = unscorable step) and its
  sequence's score is not NaN.  Every counted step reward is normalised by the
  mean and unbiased std of all counted step rewards of its group's G outputs
  (``(r - mean) / (std + adv_eps)``; a group with fewer than 2 counted steps,
  or all equal, gives 0); a token's advantage is the sum of the normalised
  rewards of its sequence's steps that end at or after it.  Tokens after the
  last step get 0; ``ret = adv``; ``token_rewards`` are not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from rlft.core.ops import masked_mean, masked_sum, masked_whiten
from rlft.registry import Registry


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an advantage estimator may read (see the module docstring)."""

    scores: Tensor  # (B,) sequence (outcome) reward; NaN = unscorable
    mask: Tensor  # (B, T) valid response tokens (0/1 or bool)
    group_size: int  # G; groups contiguous, B = P * G
    token_rewards: Tensor | None = None  # (B, T) per-token rewards excluding the score (e.g. -beta * kl_t); None = 0
    values: Tensor | None = None  # (B, T) critic values V(s_t) at each response position
    baseline: float | None = None  # running baseline of reinforce with baseline='ema' (kept by the trainer)
    step_rewards: Tensor | None = None  # (B, T) reward of the step ending at each token (NaN = unscorable), else 0
    step_mask: Tensor | None = None  # (B, T) 1 at the token where a step ends (process supervision)
    reward_parts: Tensor | None = None  # (B, K) each reward component, unweighted (NaN = unscorable): GDPO
    reward_weights: tuple[float, ...] | None = None  # (K,) the weight of each column of reward_parts

    def __post_init__(self) -> None:
        if self.scores.dim() != 1:
            raise ValueError(f"scores must be 1-D (B,), got shape {tuple(self.scores.shape)}")
        if self.mask.dim() != 2 or self.mask.shape[0] != self.scores.shape[0]:
            raise ValueError(f"mask must be (B, T) with B={self.scores.shape[0]}, got shape {tuple(self.mask.shape)}")
        if self.reward_parts is not None and (self.reward_parts.dim() != 2
                                              or self.reward_parts.shape[0] != self.scores.shape[0]):
            raise ValueError(f"reward_parts must be (B, K) with B={self.scores.shape[0]}, "
                             f"got shape {tuple(self.reward_parts.shape)}")
        for name in ("token_rewards", "values", "step_rewards", "step_mask"):
            x = getattr(self, name)
            if x is not None and x.shape != self.mask.shape:
                raise ValueError(f"{name} must have the mask's shape {tuple(self.mask.shape)}, got {tuple(x.shape)}")


AdvantageFn = Callable[[AdvantageInputs, Any], "tuple[Tensor, Tensor]"]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


# ----------------------------------------------------------------------------- group statistics, (B,) -> (B,)


def _groups(scores: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """(B,) scores -> (P, G) rewards with NaN -> 0, and the (P, G) valid mask."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D (B,), got shape {tuple(scores.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if scores.numel() % group_size != 0:
        raise ValueError(
            f"batch size B={scores.numel()} is not divisible by group_size G={group_size}; "
            "groups must be contiguous and complete (B = P * G)"
        )
    r = scores if scores.is_floating_point() else scores.float()
    r = r.reshape(-1, group_size)  # (P, G)
    valid = ~torch.isnan(r)  # (P, G)
    return torch.where(valid, r, torch.zeros_like(r)), valid


def _stats(r: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-group count, mean, unbiased std, zero_std of the valid entries of (P, G) r."""
    n = valid.sum(-1)  # (P,)
    nf = n.to(r.dtype)
    mean = r.sum(-1) / nf.clamp(min=1)  # (P,)  NaNs were zeroed by _groups
    dev2 = torch.where(valid, (r - mean[:, None]) ** 2, torch.zeros_like(r))  # (P, G)
    std = torch.sqrt(dev2.sum(-1) / (nf - 1).clamp(min=1))  # (P,)  Bessel: / (n - 1)
    std = torch.where(n >= 2, std, torch.zeros_like(std))
    hi = torch.where(valid, r, torch.full_like(r, -torch.inf)).amax(-1)  # (P,)
    lo = torch.where(valid, r, torch.full_like(r, torch.inf)).amin(-1)  # (P,)
    zero_std = (n < 2) | (hi == lo)  # (P,)  exact equality, not std < tol
    return n, mean, std, zero_std


def group_stats(scores: Tensor, group_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group (mean (P,), unbiased std (P,), zero_std (P,) bool) over valid scores.

    Groups with no valid score have mean 0; fewer than 2, std 0.  ``zero_std``
    is True when all valid rewards of a group are equal (including groups with
    fewer than 2 valid), which feeds the metric ``frac_reward_zero_std``.
    """
    r, valid = _groups(scores, group_size)
    _, mean, std, zero_std = _stats(r, valid)
    return mean, std, zero_std


def _finish(adv: Tensor, valid: Tensor, zero_std: Tensor) -> Tensor:
    """Zero invalid samples and degenerate groups; (P, G) -> (B,)."""
    keep = valid & ~zero_std[:, None]  # (P, G)
    return torch.where(keep, adv, torch.zeros_like(adv)).reshape(-1)  # (B,)


def group_norm(scores: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """GRPO: A_i = (r_i - mean(r)) / (std(r) + eps) within the group (unbiased std); (B,) -> (B,)."""
    r, valid = _groups(scores, group_size)  # (P, G)
    _, mean, std, zero_std = _stats(r, valid)
    adv = (r - mean[:, None]) / (std[:, None] + eps)  # DeepSeekMath (Shao et al. 2024) §4.1.2, outcome supervision
    return _finish(adv, valid, zero_std)  # (B,)


def group_mean(scores: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """Dr. GRPO: A_i = r_i - mean(r), no std division (``eps`` unused); (B,) -> (B,)."""
    r, valid = _groups(scores, group_size)  # (P, G)
    _, mean, _, zero_std = _stats(r, valid)
    adv = r - mean[:, None]  # Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training") eq. 3
    return _finish(adv, valid, zero_std)  # (B,)


def rloo(scores: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """RLOO: A_i = r_i - mean_{j != i} r_j over valid samples (``eps`` unused); (B,) -> (B,)."""
    r, valid = _groups(scores, group_size)  # (P, G)
    n, _, _, zero_std = _stats(r, valid)
    nf = n.to(r.dtype)[:, None]  # (P, 1)
    baseline = (r.sum(-1, keepdim=True) - r) / (nf - 1).clamp(min=1)  # (P, G) leave-one-out mean
    adv = r - baseline  # Ahmadian et al. 2024 ("Back to basics"), RLOO estimator; Kool et al. 2019
    return _finish(adv, valid, zero_std)  # (B,)


def maxrl(scores: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """MaxRL: A_i = (r_i - mean(r)) / mean(r) within the group, 0 where mean(r) = 0 (``eps`` unused); (B,) -> (B,).

    Maximum Likelihood RL (Tajwar et al. 2026, arXiv:2602.02710): averaging grad log pi over the
    successful samples only (1/K sum over the K correct of N) is an unbiased estimator of the
    gradient of the order-N truncation of log p(correct) (their Theorem 2); subtracting the mean
    over all N samples as a control variate gives per sample (r_i / rbar - 1) / N, i.e. this
    advantage under a mean over the group.  Defined for pass/fail rewards: a valid reward outside
    [0, 1] is an error, not silently rescaled.
    """
    r, valid = _groups(scores, group_size)  # (P, G)
    if (valid & ((r < 0) | (r > 1))).any():
        raise ValueError("advantage 'maxrl' needs pass/fail rewards in [0, 1] (MaxRL's success indicator); "
                         f"got values in [{r[valid].min().item()}, {r[valid].max().item()}] "
                         "(KL in the reward or an overlong penalty also moves them out)")
    _, mean, _, zero_std = _stats(r, valid)
    pos = mean[:, None] > 0  # (P, 1)
    adv = torch.where(pos, (r - mean[:, None]) / torch.where(pos, mean[:, None], torch.ones_like(r)), torch.zeros_like(r))
    return _finish(adv, valid, zero_std)  # (B,)


# ----------------------------------------------------------------------------- token-level returns, (B, T)


def gae_advantages(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float | Tensor) -> Tensor:
    """GAE A_t = sum_l (gamma * lam)^l delta_{t+l} over the valid tokens; (B, T) -> (B, T).

    ``lam`` is a float or a per-sequence (B,) tensor.  Invalid positions are
    skipped (never read, 0 in the output) and V = 0 after the last valid token.
    """
    keep = mask != 0  # (B, T)
    zero = rewards.new_zeros(())
    r = torch.where(keep, rewards, zero)  # (B, T)
    v = torch.where(keep, values.to(r.dtype), zero)  # (B, T)
    decay = gamma * torch.as_tensor(lam, dtype=r.dtype, device=r.device).reshape(-1)  # (B,) or (1,)
    acc = r.new_zeros(r.shape[0])  # (B,) A_{t+1}
    next_v = r.new_zeros(r.shape[0])  # (B,) V_{t+1}, 0 past the last valid token
    adv = torch.zeros_like(r)  # (B, T)
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_v - v[:, t]  # (B,) TD residual, Schulman et al. 2016 §3
        acc = torch.where(keep[:, t], delta + decay * acc, acc)  # Schulman et al. 2016 eq. 16, backward recursion
        next_v = torch.where(keep[:, t], v[:, t], next_v)
        adv[:, t] = torch.where(keep[:, t], acc, zero)
    return adv  # (B, T)


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Return-to-go G_t = sum_l gamma^l r_{t+l} over the valid tokens; (B, T) -> (B, T)."""
    return gae_advantages(rewards, torch.zeros_like(rewards), mask, gamma, 1.0)  # GAE(gamma, 1) with V = 0


def length_adaptive_lambda(lengths: Tensor, alpha: float) -> Tensor:
    """VAPO length-adaptive lambda_actor = 1 - 1 / (alpha * length), clamped to [0, 1]; (B,) -> (B,)."""
    if alpha <= 0:
        raise ValueError(f"length_alpha must be > 0 for a length-adaptive lambda, got {alpha}")
    n = lengths.to(torch.promote_types(lengths.dtype, torch.float32))  # (B,)
    return (1.0 - 1.0 / (alpha * n)).clamp(0.0, 1.0)  # VAPO (Yuan et al. 2025) eq. 7; length 0 -> 0


def ema_update(prev: float | None, value: float, momentum: float) -> float:
    """Exponential moving average: momentum * prev + (1 - momentum) * value; the first call returns value."""
    if prev is None:
        return float(value)
    return momentum * prev + (1.0 - momentum) * float(value)


def outcome_rewards(inp: AdvantageInputs) -> Tensor:
    """Sequence reward of the group estimators: score + sum of valid token_rewards; (B,), NaN stays NaN."""
    scores = inp.scores if inp.scores.is_floating_point() else inp.scores.float()
    if inp.token_rewards is None:
        return scores  # (B,)
    return scores + masked_sum(inp.token_rewards, inp.mask, dim=-1)  # (B,) KL-in-reward (OpenRLHF RLOO)


def _token_inputs(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """Per-token rewards (B, T), score added at the last valid token, and the (B, T) mask of scorable tokens."""
    valid = inp.mask != 0  # (B, T)
    ok = ~torch.isnan(inp.scores) & valid.any(-1)  # (B,) scorable, with a token to carry the score
    keep = valid & ok[:, None]  # (B, T)
    dtypes = [x.dtype for x in (inp.scores, inp.token_rewards, inp.values) if x is not None and x.is_floating_point()]
    dtype = reduce(torch.promote_types, dtypes, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=inp.scores.device)
    tr = zero if inp.token_rewards is None else inp.token_rewards.to(dtype)
    r = torch.where(keep, tr, zero)  # (B, T)
    pos = torch.arange(keep.shape[1], device=keep.device)  # (T,)
    last = F.one_hot(torch.where(keep, pos, -1).argmax(-1), keep.shape[1]).bool() & keep  # (B, T)
    score = torch.where(ok, inp.scores.to(dtype), zero)  # (B,)
    return r + torch.where(last, score[:, None], zero), keep  # PPO-RLHF reward, Ziegler et al. 2019 eq. 2


def _mean_seq_return(ret: Tensor, keep: Tensor) -> Tensor:
    """Mean over sequences with a valid token of G_0, the return at their first valid token; a scalar."""
    first = keep.int().argmax(-1)  # (B,)
    g0 = ret.gather(1, first[:, None]).squeeze(1)  # (B,)
    return masked_mean(g0, keep.any(-1))


def mean_return(inp: AdvantageInputs, gamma: float) -> float:
    """Mean sequence return G_0 over scorable sequences: the ``batch_mean`` baseline, and the ``ema`` update value."""
    r, keep = _token_inputs(inp)
    return float(_mean_seq_return(discounted_returns(r, keep, gamma), keep))


# ----------------------------------------------------------------------------- registered estimators


def _outcome_estimator(seq_fn: Callable[[Tensor, int, float], Tensor]) -> AdvantageFn:
    def estimator(inp: AdvantageInputs, cfg: Any) -> tuple[Tensor, Tensor]:
        seq_adv = seq_fn(outcome_rewards(inp), inp.group_size, cfg.adv_eps)  # (B,)
        adv = torch.where(inp.mask != 0, seq_adv[:, None], seq_adv.new_zeros(()))  # (B, T) broadcast over valid tokens
        return adv, adv.clone()  # ret = adv, verl's convention for outcome estimators

    estimator.__name__ = f"{seq_fn.__name__}_estimator"
    estimator.__doc__ = f"Registry entry: {seq_fn.__name__} of outcome_rewards(inp), broadcast over valid tokens."
    return estimator


for _name, _fn in (("group_norm", group_norm), ("group_mean", group_mean), ("rloo", rloo), ("maxrl", maxrl)):
    ADVANTAGES.register(_name)(_outcome_estimator(_fn))


def gdpo_advantages(parts: Tensor, weights: "tuple[float, ...]", scorable: Tensor, group_size: int,
                    eps: float = 1e-6) -> Tensor:
    """GDPO: each reward component group-normalised on its own, weighted, summed, then normalised over the batch.

    A_sum,i = sum_k w_k group_norm(r_k)_i (a NaN component is out of its group's statistics and adds 0), then
    A_i = (A_sum,i - mean) / (std + eps) over the ``scorable`` (B,) sequences (unbiased std; 0 elsewhere).
    Liu et al. 2026 (arXiv:2601.05242): group-wise normalisation decoupled per reward, then batch-wise
    advantage normalisation; the paper sums the components unweighted (w_k = 1), rlft weights each
    normalised component by its reward.weights entry (so a weight still ranks the components).  (B, K) -> (B,).
    """
    if parts.shape[1] != len(weights):
        raise ValueError(f"GDPO: {parts.shape[1]} reward components but {len(weights)} weights")
    total = torch.zeros(parts.shape[0], dtype=torch.promote_types(parts.dtype, torch.float32), device=parts.device)
    for k, w in enumerate(weights):
        total = total + w * group_norm(parts[:, k], group_size, eps)  # (B,)  0 at NaN and in degenerate groups
    n = scorable.sum()
    if n < 2:
        return torch.zeros_like(total)
    mean = masked_mean(total, scorable)
    std = torch.sqrt(masked_sum((total - mean) ** 2, scorable) / (n - 1))  # unbiased, over scorable sequences
    return torch.where(scorable, (total - mean) / (std + eps), torch.zeros_like(total))  # (B,)


@ADVANTAGES.register("gdpo")
def gdpo(inp: AdvantageInputs, cfg: Any) -> tuple[Tensor, Tensor]:
    """GDPO over ``inp.reward_parts`` (see :func:`gdpo_advantages`), broadcast over valid tokens; ret = adv."""
    if inp.reward_parts is None or inp.reward_weights is None:
        raise ValueError("advantage 'gdpo' needs reward_parts (B, K) and reward_weights in AdvantageInputs: "
                         "the per-component rewards the trainer's score() records")
    scorable = ~torch.isnan(inp.scores)  # (B,)
    seq_adv = gdpo_advantages(inp.reward_parts, inp.reward_weights, scorable, inp.group_size, cfg.adv_eps)  # (B,)
    adv = torch.where(inp.mask != 0, seq_adv[:, None], seq_adv.new_zeros(()))  # (B, T)
    return adv, adv.clone()


@ADVANTAGES.register("gae")
def gae(inp: AdvantageInputs, cfg: Any) -> tuple[Tensor, Tensor]:
    """PPO's GAE with a critic; VAPO decoupled (``lam`` vs ``lam_critic``) and length-adaptive lambda."""
    if inp.values is None:
        raise ValueError("advantage 'gae' needs `values`: critic values V(s_t) of shape (B, T) in AdvantageInputs")
    r, keep = _token_inputs(inp)  # (B, T)
    v = torch.where(keep, inp.values.to(r.dtype), r.new_zeros(()))  # (B, T)
    lam = cfg.lam
    if cfg.length_alpha > 0:
        lengths = (inp.mask != 0).sum(-1)  # (B,)
        lam = length_adaptive_lambda(lengths, cfg.length_alpha)  # (B,) VAPO (Yuan et al. 2025) eq. 7/8, actor only
    adv = gae_advantages(r, v, keep, cfg.gamma, lam)  # (B, T) actor, Schulman et al. 2016 eq. 16
    ret = gae_advantages(r, v, keep, cfg.gamma, cfg.lam_critic) + v  # (B, T) critic target, VAPO decoupled GAE
    if cfg.whiten_adv:
        adv = masked_whiten(adv, keep)  # verl-style batch whitening over scorable tokens
    valid = inp.mask != 0  # (B, T)
    unscored = torch.where(valid, inp.values.to(r.dtype), r.new_zeros(()))  # (B, T) ret = V: zero critic error
    return adv, torch.where(keep, ret, unscored)


def process_advantages(step_rewards: Tensor, step_mask: Tensor, mask: Tensor, group_size: int,
                       eps: float = 1e-6, gamma: float = 1.0) -> Tensor:
    """GRPO with process supervision: group-normalised step rewards summed over the steps at or after t; (B, T).

    A step is counted at a valid token (``mask``) with ``step_mask`` set and a
    non-NaN reward; its normalised reward is ``(r - mean) / (std + eps)`` over
    every counted step of the group's G outputs (unbiased std; a group with
    fewer than 2 counted steps or all-equal rewards gives 0). ``gamma`` < 1
    discounts a later step by gamma per valid token between t and the step's
    last token: A_t = sum_{index(j) >= t} gamma^(valid tokens in (t, index(j)]) r~_j
    (DeepSeekMath's undiscounted sum at gamma = 1).
    """
    B, T = mask.shape
    if B % group_size != 0:
        raise ValueError(f"batch size B={B} is not divisible by group_size G={group_size}")
    r = step_rewards if step_rewards.is_floating_point() else step_rewards.float()
    step = (step_mask != 0) & (mask != 0) & ~torch.isnan(r)  # (B, T) counted steps
    zero = r.new_zeros(())
    rg = torch.where(step, r, zero).reshape(-1, group_size * T)  # (P, G*T) a group's steps side by side
    n, mean, std, zero_std = _stats(rg, step.reshape(-1, group_size * T))  # (P,) each, over the group's steps
    norm = (rg - mean[:, None]) / (std[:, None] + eps)  # DeepSeekMath §4.1.3: r~ = (r - mean(R)) / std(R)
    norm = torch.where(step.reshape(rg.shape) & ~zero_std[:, None], norm, zero).reshape(B, T)  # (B, T)
    if gamma == 1.0:
        adv = norm.flip(-1).cumsum(-1).flip(-1)  # (B, T) DeepSeekMath §4.1.3: A_t = sum_{index(j) >= t} r~_j
    else:
        adv = discounted_returns(norm, mask, gamma)  # (B, T) the same sum, gamma^l per valid token l ahead
    return torch.where(mask != 0, adv, zero)


@ADVANTAGES.register("process")
def process(inp: AdvantageInputs, cfg: Any) -> tuple[Tensor, Tensor]:
    """GRPO with process supervision (DeepSeekMath §4.1.3) over ``step_rewards`` / ``step_mask``; ret = adv."""
    if inp.step_rewards is None or inp.step_mask is None:
        raise ValueError("advantage 'process' needs step_rewards and step_mask (B, T) in AdvantageInputs: "
                         "a step-level reward in reward.fns (e.g. chain_steps)")
    scorable = ~torch.isnan(inp.scores)  # (B,) an unscorable sequence has no counted step
    mask = (inp.mask != 0) & scorable[:, None]  # (B, T)
    adv = process_advantages(inp.step_rewards, inp.step_mask, mask, inp.group_size, cfg.adv_eps,
                             cfg.gamma)  # (B, T)
    return adv, adv.clone()


@ADVANTAGES.register("reinforce")
def reinforce(inp: AdvantageInputs, cfg: Any) -> tuple[Tensor, Tensor]:
    """REINFORCE with baseline: A_t = G_t - b, b from ``cfg.baseline`` (none | batch_mean | ema)."""
    r, keep = _token_inputs(inp)  # (B, T)
    ret = discounted_returns(r, keep, cfg.gamma)  # (B, T) return-to-go, Williams 1992
    if cfg.baseline == "none":
        b: Tensor | float = 0.0
    elif cfg.baseline == "batch_mean":
        b = _mean_seq_return(ret, keep)  # mean G_0 over scorable sequences
    elif cfg.baseline == "ema":
        if inp.baseline is None:
            raise ValueError("baseline='ema' needs AdvantageInputs.baseline (the trainer's running mean return)")
        b = inp.baseline
    else:
        raise ValueError(f"algo.baseline: unknown {cfg.baseline!r}; allowed: none, batch_mean, ema")
    adv = torch.where(keep, ret - b, r.new_zeros(()))  # (B, T) REINFORCE with a baseline (Williams 1992)
    return adv, ret


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp(inp: AdvantageInputs, cfg: Any) -> tuple[Tensor, Tensor]:
    """REINFORCE++: KL-shaped return-to-go, whitened over all scorable tokens of the batch (not per group)."""
    r, keep = _token_inputs(inp)  # (B, T)
    ret = discounted_returns(r, keep, cfg.gamma)  # (B, T) REINFORCE++ (Hu et al. 2025): r(x,y) - beta sum_{i>=t} KL_i
    adv = masked_whiten(ret, keep)  # (B, T) REINFORCE++ global advantage normalization
    return adv, ret


@ADVANTAGES.register("reinforce_pp_baseline")
def reinforce_pp_baseline(inp: AdvantageInputs, cfg: Any) -> tuple[Tensor, Tensor]:
    """REINFORCE++ w/ baseline: outcome reward minus its group mean, whitened over all valid tokens of the batch.

    A_i = R_i - mean_{j in group(i)} R_j with R = ``outcome_rewards(inp)`` (score
    plus the sum of valid token rewards, e.g. KL-in-reward); broadcast over the
    valid tokens; then ``masked_whiten`` over the valid tokens of the scorable
    sequences, so long sequences weigh more in the batch mean and std.  ``cfg``
    is not read (``adv_eps`` unused: whitening has its own 1e-8 inside the sqrt).
    Returns ``(adv, ret)`` with ``ret`` = R_i at every valid token (the
    undiscounted sequence return, before centring and whitening; 0 if unscorable).

    Conventions that differ from verl's ``compute_reinforce_plus_plus_baseline_outcome_advantage``:
    NaN scores are excluded from the group mean and get advantage 0 (verl has no
    unscorable samples); a group with fewer than 2 valid samples, or with all
    valid rewards equal, is centred to exactly 0 (verl gives a size-1 group the
    baseline 0, so its raw reward enters the whitening); ``ret`` is R, not the
    whitened advantage; fewer than 2 valid tokens whiten to 0 (verl's
    ``masked_var`` raises).  Same as verl: unbiased token variance, 1e-8 inside
    the sqrt, the mean shift of whitening (a centred-to-0 sequence can end
    non-zero).
    """
    valid = inp.mask != 0  # (B, T)
    keep = valid & ~torch.isnan(inp.scores)[:, None]  # (B, T) valid tokens of scorable sequences
    r = outcome_rewards(inp)  # (B,) R_i, NaN if unscorable
    seq_adv = group_mean(r, inp.group_size)  # (B,) R_i - group mean; Hu et al. 2025 (arXiv:2501.03262) w/ baseline
    zero = seq_adv.new_zeros(())
    adv = masked_whiten(torch.where(keep, seq_adv[:, None], zero), keep)  # (B, T) REINFORCE++ global normalization
    ret = torch.where(keep, r[:, None], zero)  # (B, T) R_i broadcast; NaN rows masked to 0
    return adv, ret
