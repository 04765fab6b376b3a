"""Per-token estimators of KL(pi || ref) from samples drawn from pi.

Every estimator: ``fn(logp, ref_logp) -> (B, T)`` where ``logp = log pi(x)`` and
``ref_logp = log ref(x)`` at the sampled tokens.  With r = ref(x) / pi(x):

* ``k1 = -log r``                 unbiased, high variance, can be negative
* ``k2 = (log r)^2 / 2``          biased, low variance, >= 0
* ``k3 = (r - 1) - log r``        unbiased, low variance, >= 0
* ``abs = |log r|``               biased, >= 0
* ``k1+``, ``k2+``, ``k3+``       straight-through: the value of k1 / k2 / k3 with the gradient of k2

Straight-through "+" estimators (verl's ``kl_penalty`` with a ``+`` suffix):
the value of the named estimator, the gradient of k2.  Used as a loss term,
k1 and k3 have an unbiased *value* but a biased *gradient* of KL(pi || ref)
(E_pi[grad k1] = E_pi[grad log pi] = 0); k2's gradient (log pi - log ref) grad log pi
is the score-function gradient of KL(pi || ref) at a sample of pi.  So ``k3+`` logs
and adds k3's low-variance value but trains with the unbiased gradient;
``k2+`` is k2 itself.  The "+" matters only when the KL is back-propagated
(``algo.kl_in=loss``); as a reward penalty (detached) it equals its base.

Reference: J. Schulman, "Approximating KL Divergence" (2020),
http://joschu.net/blog/kl-approx.html.  k3 is the estimator GRPO puts in its
loss (DeepSeekMath eq. 4).  Callers reduce with the loss mask.

The KL can also enter as a per-token reward penalty instead of a loss term
(PPO-RLHF): ``kl_penalty_rewards`` gives -coef * kl_t, and a KL controller
(``FixedKLController`` or ``AdaptiveKLController``, built by
``make_kl_controller``) supplies ``coef``.  Controllers share one interface:
``.value`` (the current coefficient), ``.update(current_kl, n_steps)``,
``state_dict()`` / ``load_state_dict()`` (``{"value": float}``).

``PenaltyCoefController`` is the adaptive beta of PPO's KL-penalty objective
(Schulman et al. 2017, §4): halve beta when the measured KL(pi_old || pi) is below
d_targ / 1.5, double it above 1.5 d_targ.  It shares the interface (its state
also records the target).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch
from torch import Tensor

from rlft.registry import Registry

KLFn = Callable[[Tensor, Tensor], Tensor]
KL_ESTIMATORS: Registry[KLFn] = Registry("kl estimator")

LOG_RATIO_CLAMP = 20.0  # |log r| bound before exp in k3, for numerical safety only


@KL_ESTIMATORS.register("k1")
def k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """log pi - log ref (Schulman 2020, k1)."""
    return logp - ref_logp  # (B, T)


@KL_ESTIMATORS.register("k2")
def k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """(log pi - log ref)^2 / 2 (Schulman 2020, k2)."""
    return 0.5 * (logp - ref_logp) ** 2  # (B, T)


@KL_ESTIMATORS.register("k3")
def k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """exp(log r) - log r - 1 with log r = log ref - log pi (Schulman 2020, k3; DeepSeekMath eq. 4)."""
    log_r = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)
    return torch.exp(log_r) - log_r - 1.0  # (B, T)  >= 0 since e^x >= 1 + x


def _straight_through(value: Tensor, grad_of: Tensor) -> Tensor:
    """Forward: ``value``; backward: the gradient of ``grad_of`` (g - sg[g] is exactly 0 in value)."""
    return grad_of - grad_of.detach() + value.detach()  # (B, T)


@KL_ESTIMATORS.register("k1+")
def k1_plus(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Value of k1, gradient of k2: (log pi - log ref) * grad log pi (verl kl_penalty 'k1+')."""
    return _straight_through(k1(logp, ref_logp), k2(logp, ref_logp))  # (B, T)


@KL_ESTIMATORS.register("k2+")
def k2_plus(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 already has the gradient of k2: ``k2+`` is k2 (verl kl_penalty 'k2+')."""
    return k2(logp, ref_logp)  # (B, T)


@KL_ESTIMATORS.register("k3+")
def k3_plus(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Value of k3, gradient of k2 (verl kl_penalty 'k3+', straight-through)."""
    return _straight_through(k3(logp, ref_logp), k2(logp, ref_logp))  # (B, T)


@KL_ESTIMATORS.register("abs")
def abs_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """|log pi - log ref|."""
    return (logp - ref_logp).abs()  # (B, T)


# --------------------------------------------------------------------------- KL as a reward penalty


def kl_penalty_rewards(logp: Tensor, ref_logp: Tensor, mask: Tensor, coef: float, estimator: str) -> Tensor:
    """Per-token reward penalty -coef * kl_t at valid tokens, 0 elsewhere.

    R_t = r(x, y) [t = last] - beta * KL_t  (InstructGPT, Ouyang et al. 2022, eq. 2;
    Ziegler et al. 2019, §2.2); ``estimator`` names a ``KL_ESTIMATORS`` entry.
    Rewards carry no gradient in PPO: pass detached log-probs.
    """
    kl = KL_ESTIMATORS.get(estimator)(logp, ref_logp)  # (B, T)
    valid = mask != 0  # (B, T)
    return torch.where(valid, -coef * kl, torch.zeros_like(kl))  # (B, T)


class KLController(Protocol):
    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class _ValueState:
    value: float

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class FixedKLController(_ValueState):
    """A constant KL coefficient; ``update`` does nothing."""

    def __init__(self, coef: float):
        if coef < 0:
            raise ValueError(f"KL coefficient must be >= 0, got {coef}")
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController(_ValueState):
    """Steer the coefficient so the measured KL tracks ``target`` (Ziegler et al. 2019, §2.2).

    e = clip(KL / target - 1, -0.2, 0.2);  beta <- beta * (1 + e * n_steps / horizon),
    where ``n_steps`` is the number of samples (or steps) since the last update
    and ``horizon`` sets how fast beta moves.
    """

    ERROR_CLIP = 0.2  # Ziegler et al. 2019, §2.2

    def __init__(self, init_coef: float, target: float, horizon: int):
        if init_coef < 0:
            raise ValueError(f"KL coefficient must be >= 0, got {init_coef}")
        if target <= 0:
            raise ValueError(f"KL target must be > 0, got {target}")
        if horizon <= 0:
            raise ValueError(f"KL horizon must be > 0, got {horizon}")
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -self.ERROR_CLIP), self.ERROR_CLIP)  # proportional error
        self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(coef: float, target: float, horizon: int) -> KLController:
    """``AdaptiveKLController(coef, target, horizon)`` if target > 0, else ``FixedKLController(coef)``."""
    if target < 0:
        raise ValueError(f"KL target must be >= 0 (0: fixed coefficient), got {target}")
    return AdaptiveKLController(coef, target, horizon) if target > 0 else FixedKLController(coef)


class PenaltyCoefController(_ValueState):
    """Adaptive beta of PPO's KL-penalty objective (Schulman et al. 2017, §4, after eq. 8).

    After each policy update, with d the measured KL(pi_old || pi):
    d < d_targ / 1.5: beta <- beta / 2;  d > d_targ * 1.5: beta <- beta * 2.
    ``target`` 0 keeps beta fixed.  ``n_steps`` is ignored (one rule per update).
    """

    BAND = 1.5  # PPO §4: the heuristic tolerance around d_targ
    FACTOR = 2.0  # PPO §4: the multiplicative step of beta

    def __init__(self, init_coef: float, target: float):
        if init_coef < 0:
            raise ValueError(f"penalty coefficient must be >= 0, got {init_coef}")
        if target < 0:
            raise ValueError(f"penalty target must be >= 0 (0: fixed coefficient), got {target}")
        self.value = float(init_coef)
        self.target = float(target)

    def update(self, current_kl: float, n_steps: int) -> None:
        if self.target == 0:
            return
        if current_kl < self.target / self.BAND:
            self.value /= self.FACTOR
        elif current_kl > self.target * self.BAND:
            self.value *= self.FACTOR

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "target": self.target}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value, self.target = float(state["value"]), float(state["target"])
