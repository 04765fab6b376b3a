"""Health warnings: rules over an RL run's logged metrics, each with a threshold in ``health`` and advice.

Every RL step the monitor looks at the mean of the last ``health.window`` steps
of the metrics a rule reads and logs ``health/<rule>`` (1.0 while the rule
fires, else 0.0). The first time a rule fires, the run prints one line: what it
means and what to try (the usual advice of the RL-for-LLMs tutorials); the final
summary and ``health.json`` list every rule that fired, with its first and last
step. A rule whose metrics a run does not log (no KL term, no validation) never
fires.

The monitor also counts, per reward, the RL steps in a row where it failed on at least :data:`FAIL_FRAC` of the
samples (``reward/<fn>/failed_frac``), and so for the environment's lost trajectories (``env/failed_frac``: an
environment or an agent that raises, hangs or is refused on nearly every episode trains on nothing, as a failing
reward does; its name is :data:`ENV`); the RL loop stops the run after ``health.reward_fail_steps`` of them
(:meth:`HealthMonitor.failing_reward`). While rewards fail on most samples, the rules that read the rewards'
spread (``no_learning_signal``, ``reward_std``) stay quiet: the rewards are missing, not equal, and
``reward_failures`` says so instead.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable

from rlft.registry import Registry


@dataclass(frozen=True)
class Rule:
    check: Callable[["HealthMonitor", object], bool]  # (monitor, health config) -> firing
    advice: str


RULES: Registry[Rule] = Registry("health rule")

FAIL_FRAC = 0.9
ENV = "env"  # the name :meth:`HealthMonitor.failing_reward` gives the environment (or agent) that lost its episodes
"""A step counts toward ``health.reward_fail_steps`` when a reward failed on at least this share of its samples."""


def _mean(monitor: "HealthMonitor", key: str) -> float | None:
    vals = [m[key] for m in monitor.window if key in m and math.isfinite(m[key])]
    return sum(vals) / len(vals) if vals else None


def _over(key: str, limit: str) -> Callable[["HealthMonitor", object], bool]:
    def check(monitor: "HealthMonitor", h) -> bool:
        v = _mean(monitor, key)
        return v is not None and v > getattr(h, limit)
    return check


def _sampler_gap(monitor: "HealthMonitor", h) -> bool:
    """The sampler's log-prob gap, over the steps whose batch the current weights sampled: a stale batch's gap
    (train.async, async/staleness > 0) holds an update's change too, which the correction is there for."""
    vals = [m["rollout_corr/logp_gap_mean"] for m in monitor.window
            if math.isfinite(m.get("rollout_corr/logp_gap_mean", math.nan)) and not m.get("async/staleness")]
    return bool(vals) and sum(vals) / len(vals) > h.rollout_gap_max


def _kl(monitor: "HealthMonitor", h) -> bool:
    v = _mean(monitor, "actor/kl_loss")  # KL to the reference in the loss (GRPO), per token
    if v is None:
        v = _mean(monitor, "actor/reward_kl_penalty")  # ... or in the reward (PPO)
    return v is not None and v > h.kl_max


def _entropy(monitor: "HealthMonitor", h) -> bool:
    v = _mean(monitor, "actor/entropy")
    return v is not None and v < h.entropy_min


def _reward_std(monitor: "HealthMonitor", h) -> bool:
    v = _mean(monitor, "reward/group_std")
    return v is not None and v < h.reward_std_min and not _rewards_failed(monitor, h)


def _no_signal(monitor: "HealthMonitor", h) -> bool:
    v = _mean(monitor, "frac_reward_zero_std")
    return v is not None and v > h.zero_std_max and not _rewards_failed(monitor, h)


def _rewards_failed(monitor: "HealthMonitor", h) -> bool:
    """Over the window, some reward failed on half of its samples or more (the mean of its failed_frac)."""
    keys = {k for m in monitor.window for k in m if k.startswith("reward/") and k.endswith("/failed_frac")}
    return any((_mean(monitor, k) or 0.0) >= 0.5 for k in keys)


def _length_collapse(monitor: "HealthMonitor", h) -> bool:
    v = _mean(monitor, "response_length/mean")
    return v is not None and monitor.start_length is not None and v < h.length_drop * monitor.start_length


def _nonfinite(monitor: "HealthMonitor", h) -> bool:
    last = monitor.window[-1] if monitor.window else {}
    return any(not math.isfinite(v) for v in last.values()) or last.get("actor/skipped_steps", 0.0) > 0


def _hacking(monitor: "HealthMonitor", h) -> bool:
    """On any held-out set, the latest validation accuracy fell by more than ``val_drop`` below that set's best one
    while the training reward (mean of the steps since) rose above what it was at the best validation."""
    return any(_fell_while_reward_rose(points, h.val_drop) for points in monitor.validations.values())


def _fell_while_reward_rose(points: list[tuple[int, float, float]], val_drop: float) -> bool:
    if len(points) < 2:
        return False
    best = max(points, key=lambda v: v[1])
    step, acc, reward = points[-1]
    return step > best[0] and acc < best[1] - val_drop and reward > best[2]


RULES.register("kl_blowup")(Rule(_kl, "the policy moves far from the reference (KL per token above health.kl_max): "
                                      "raise the KL coefficient (algo.kl_coef) or lower optim.lr"))
RULES.register("grad_norm_explosion")(Rule(_over("actor/grad_norm", "grad_norm_max"),
                                           "gradient norms above health.grad_norm_max: lower optim.lr, keep "
                                           "optim.grad_clip on, check the rewards for extreme values"))
RULES.register("entropy_collapse")(Rule(_entropy, "token entropy below health.entropy_min: the policy has become "
                                                  "nearly deterministic and stops exploring: raise "
                                                  "rollout.temperature or algo.entropy_coef, lower optim.lr"))
RULES.register("no_learning_signal")(Rule(_no_signal,
                                          "most groups have equal rewards, so their advantages are 0: the task is "
                                          "too easy or too hard for the policy; use a larger algo.group_size, "
                                          "dynamic sampling (algo.dynamic_sampling) or other prompts"))
RULES.register("reward_std")(Rule(_reward_std, "the rewards barely differ inside a group (reward/group_std below "
                                                "health.reward_std_min), so the group-relative advantages carry "
                                                "little beyond noise: check that the reward can tell the samples "
                                                "apart (a reward model's scale, a too coarse rule), raise "
                                                "rollout.temperature or algo.group_size"))
RULES.register("reward_failures")(Rule(_rewards_failed, "a reward fails on half of the samples or more "
                                                        "(reward/<fn>/failed_frac): their rewards are missing, not "
                                                        "wrong; read the first error in the \"reward ... failed\" "
                                                        "lines of the log and fix the reward function (or its "
                                                        "reward.timeout_s)"))
RULES.register("length_collapse")(Rule(_length_collapse, "responses shrank below health.length_drop of their "
                                                         "first length: check the rewards for a length bias and "
                                                         "lower optim.lr"))
RULES.register("length_budget")(Rule(_over("response_length/clip_ratio", "clip_ratio_max"),
                                     "most responses hit rollout.max_new_tokens: raise the budget, or use the "
                                     "overlong filter / soft punishment (algo.overlong_filter)"))
RULES.register("clip_fraction")(Rule(_over("actor/pg_clipfrac", "clipfrac_max"),
                                     "a large share of tokens is clipped (actor/pg_clipfrac): the updates are too "
                                     "large for the trust region; lower optim.lr or algo.epochs"))
RULES.register("rollout_mismatch")(Rule(_sampler_gap,
                                        "the sampler's log-probs drift from the trainer's (rollout_corr/logp_gap_mean "
                                        "above health.rollout_gap_max): keep algo.rollout_correction on (token_mis or "
                                        "seq_mis drop the worst tokens), sample in float32 (model.autocast=none) or "
                                        "check the engine's weights and dtype"))
RULES.register("nonfinite")(Rule(_nonfinite, "a metric is NaN/inf or an update was skipped (health/skipped_steps): "
                                             "lower optim.lr, check rewards and data for extreme values"))
RULES.register("reward_hacking")(Rule(_hacking, "the training reward rises while held-out accuracy falls "
                                                "(eval.every, on any of the held-out sets): the policy exploits the "
                                                "reward; check its samples, tighten the reward, raise the KL "
                                                "coefficient"))


class HealthMonitor:
    """The rules' running state: the last steps' metrics, the first length, validations, what fired when."""

    def __init__(self, h):
        self.h = h  # the ``health`` config section
        self.window: deque[dict[str, float]] = deque(maxlen=h.window)
        self.start_length: float | None = None
        # held-out set -> [(step, its val exact match, reward mean of the window then)]
        self.validations: dict[str, list[tuple[int, float, float]]] = {}
        self.fired: dict[str, list[int]] = {}  # rule -> [first step, last step, steps firing]
        self.failing: dict[str, list] = {}  # reward -> [steps in a row failing >= FAIL_FRAC, first of them, its error]

    def update(self, step: int, metrics: dict[str, float],
               errors: dict[str, str] | None = None) -> tuple[dict[str, float], list[str]]:
        """``health/<rule>`` values of this step, and a warning line for each rule that fires for the first time;
        ``errors``: each reward's first error of the step, kept for :meth:`failing_reward`."""
        self.window.append(dict(metrics))
        self._count_failures(step, metrics, errors or {})
        if self.start_length is None and len(self.window) == self.window.maxlen:
            self.start_length = _mean(self, "response_length/mean")
        for key, v in metrics.items():  # val/<set>/exact_match of every held-out set
            if key.startswith("val/") and key.endswith("/exact_match"):
                name = key[len("val/"):-len("/exact_match")]
                self.validations.setdefault(name, []).append((step, v, _mean(self, "reward/mean") or 0.0))
        values, new = {}, []
        for name in RULES.names():
            firing = self.h.enabled and RULES.get(name).check(self, self.h)
            values[f"health/{name}"] = float(firing)
            if firing:
                if name not in self.fired:
                    self.fired[name] = [step, step, 0]
                    new.append(f"{name} at step {step}: {RULES.get(name).advice}")
                self.fired[name][1:] = [step, self.fired[name][2] + 1]
        return values, new

    def _count_failures(self, step: int, metrics: dict[str, float], errors: dict[str, str]) -> None:
        for key, v in metrics.items():
            if key == "env/failed_frac" or (key.startswith("reward/") and key.endswith("/failed_frac")):
                name = ENV if key == "env/failed_frac" else key[len("reward/"):-len("/failed_frac")]
                if v >= FAIL_FRAC:
                    run = self.failing.setdefault(name, [0, step, ""])
                    run[0] += 1
                    run[2] = run[2] or errors.get(name, "")
                else:
                    self.failing.pop(name, None)

    def failing_reward(self) -> tuple[str, int, int, str] | None:
        """(reward, first step, steps in a row, its first error) of a reward that failed on at least FAIL_FRAC of
        the samples of ``health.reward_fail_steps`` RL steps in a row; None when none did (or the limit is 0)."""
        limit = self.h.reward_fail_steps
        for name, (n, first, error) in self.failing.items():
            if limit and n >= limit:
                return name, first, n, error
        return None

    def report(self) -> dict[str, dict]:
        """What fired: ``{rule: {first_step, last_step, steps, advice}}``."""
        return {name: {"first_step": a, "last_step": b, "steps": n, "advice": RULES.get(name).advice}
                for name, (a, b, n) in sorted(self.fired.items())}

    def state_dict(self) -> dict:
        return {"window": list(self.window), "start_length": self.start_length, "validations": self.validations,
                "fired": self.fired, "failing": self.failing}

    def load_state_dict(self, state: dict) -> None:
        self.window = deque(state["window"], maxlen=self.h.window)
        self.start_length, self.fired = state["start_length"], state["fired"]
        self.failing = {name: list(run) for name, run in state.get("failing", {}).items()}  # older checkpoints: none
        saved = state["validations"]
        if isinstance(saved, list):  # a checkpoint from before several held-out sets: one unnamed set
            saved = {"": saved}
        self.validations = {name: [tuple(v) for v in points] for name, points in saved.items()}
