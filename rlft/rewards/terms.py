"""``reward.fns`` -> the reward callables: built here, once per entry, outside the configuration (which holds the
entries as plain data: a name, a weight, a label, parameters)."""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import weakref
from typing import Any, Callable

from rlft.config.checks import ConfigError
from rlft.config.env import EnvConfig
from rlft.config.sections import Config
from rlft.config.reward import RewardConfig, RewardTerm
from rlft.envs.base import steps_in_pool
from rlft.envs.build import factory
from rlft.rewards.base import REWARDS
from rlft.rewards.jail import JailUnavailable
from rlft.rewards.pool import RewardPool

_BUILT: dict[int, tuple[weakref.ref, Callable]] = {}  # id(term) -> (the term, its callable), while the term lives


def build(term: RewardTerm) -> Callable:
    """The reward callable of ``term`` with its parameters, built once per entry (a reward model's directory and
    config are read once); a bad parameter is a :class:`ConfigError` naming it."""
    hit = _BUILT.get(id(term))
    if hit is not None and hit[0]() is term:
        return hit[1]
    try:
        fn = REWARDS.build(term.name, dict(term.params))
    except KeyError as e:
        raise ConfigError(e.args[0]) from None
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from None
    key = id(term)
    _BUILT[key] = (weakref.ref(term, lambda _, key=key: _BUILT.pop(key, None)), fn)
    return fn


def built(reward: RewardConfig) -> list[tuple[str, Any]]:
    """(label, reward callable) per entry, as ``score_batch`` takes them; rewards that run programs get
    ``reward.sandbox`` unless their entry sets its own."""
    return [(t.key, _sandboxed(t, reward.sandbox)) for t in reward.fns]


def _sandboxed(term: RewardTerm, sandbox: str):
    """The term's callable, with ``sandbox`` set where it has such a field and the term did not set it."""
    fn = build(term)
    if (dataclasses.is_dataclass(fn) and "sandbox" in {f.name for f in dataclasses.fields(fn)}
            and "sandbox" not in dict(term.params) and getattr(fn, "sandbox") != sandbox):
        fn = dataclasses.replace(fn, sandbox=sandbox)
    return fn


def reward_pool(cfg: Config):
    """Worker processes for the run's slow rewards and slow environment steps (training and evaluation), or nothing
    when none is slow."""
    rules = [cfg.eval.correct_fn, cfg.eval.format_fn,
             *(name for s in cfg.eval.sets for name in (s.correct_fn, s.format_fn) if name)]  # every set's rules
    fns = [fn for _, fn in built(cfg.reward)] + [REWARDS.get(name) for name in rules]
    for fn in fns:
        if hasattr(fn, "preflight"):
            try:
                fn.preflight()
            except JailUnavailable as e:
                raise ConfigError(f"reward.sandbox={getattr(fn, 'sandbox', '?')}: {e}") from None
    if not any(getattr(fn, "runs_in_pool", False) for fn in fns) and not slow_env(cfg.env):
        return contextlib.nullcontext()
    return RewardPool(workers=cfg.reward.workers, deadline_s=cfg.reward.timeout_s).activated()


def slow_env(env: EnvConfig) -> bool:
    """Whether the configured environment's steps are slow (``rlft.envs.base.steps_in_pool``), asked of one
    environment built from the configuration. A data row's own parameters are not asked: a row whose own ``tools``
    add a slow tool steps in-process, under the same deadline, unless a pool runs for another reason. A slow
    environment that does not pickle is a :class:`ConfigError`: its steps could never reach a worker."""
    if not env.multi_turn:
        return False
    built_env = factory(env.name, env.fn)(**env.kwargs)
    if not steps_in_pool(built_env):
        return False
    try:
        pickle.dumps(built_env)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"env.{'fn' if env.name == 'custom' else 'name'}: the environment is marked runs_in_pool, "
                          f"so its steps run in worker processes, but it does not pickle: {type(e).__name__}: {e}"
                          ) from None
    return True
