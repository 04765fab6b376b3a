"""How a reward is declared, built with its parameters and called.

Four shapes, one registry (``REWARDS``):

- **per-sample** ``fn(completion, sample) -> float | None``: the common case;
- **group-level** ``fn(completions, samples) -> list[float | None]``, marked
  :func:`group_level`: called once per prompt with its G completions (voting);
- **batched** ``fn(completions, samples) -> list[float | None]``, marked
  :func:`batched`: called once on the whole batch, for rewards that run a model
  and want large batches (``reward_model``). Each value depends on its own
  sample only, so it is combined like a per-sample reward;
- **step-level** ``fn(completion, sample) -> list[tuple[int, float | None]]``,
  marked :func:`step_level`: one ``(end_char, reward)`` pair per step of the
  completion (process supervision), ``end_char`` the offset in the completion
  where the step ends, in increasing order, ``None`` an unscorable step. The
  steps feed ``algo.advantage=process`` (``rlft.rewards.steps``); the reward's
  per-sample value, combined like the others, is its mean scorable step reward.

A reward without parameters is registered as a plain function. A reward with
parameters is registered as a frozen dataclass whose fields are the parameters
(with defaults) and whose instances are the reward callables: picklable (worker
processes can run them) and validated in ``__post_init__``, where a bad value
raises ``ValueError("<field>: <what is wrong>")``. Parameter annotations are
limited to ``bool``, ``int``, ``float``, ``str``, ``Literal[...]`` and
``tuple[T, ...]`` of those, so the configuration can type-check them.

``REWARDS.get(name)`` returns a callable with the default parameters;
``REWARDS.build(name, params)`` one with the given parameters.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

from rlft.registry import Registry


def group_level(fn):
    """Mark a reward (function or class) as group-level: it scores one prompt's G completions together."""
    fn.group_level = True
    return fn


def batched(fn):
    """Mark a reward (function or class) as batched: called once on the whole batch, values per sample."""
    fn.batched = True
    return fn


def step_level(fn):
    """Mark a reward (function or class) as step-level: it returns ``(end_char, reward)`` per step."""
    fn.step_level = True
    return fn


def check_choices(params) -> None:
    """Every ``Literal``-annotated field of the parameter dataclass ``params`` holds one of its values.

    Raises ``ValueError("<field>: must be one of a, b, got 'c'")``; each reward's
    ``__post_init__`` calls it, so the annotation is the one list of choices.
    """
    for name, tp in typing.get_type_hints(type(params)).items():
        allowed = typing.get_args(tp) if typing.get_origin(tp) is Literal else None
        if allowed is not None and getattr(params, name) not in allowed:
            raise ValueError(f"{name}: must be one of {', '.join(map(str, allowed))}, got {getattr(params, name)!r}")


def is_group_level(fn: Callable) -> bool:
    return bool(getattr(fn, "group_level", False))


def is_batched(fn: Callable) -> bool:
    return bool(getattr(fn, "batched", False))


def is_step_level(fn: Callable) -> bool:
    return bool(getattr(fn, "step_level", False))


class RewardRegistry(Registry):
    """Name -> reward factory: a plain function (no parameters) or a frozen dataclass of parameters."""

    def factory(self, name: str) -> Callable:
        """What was registered under ``name`` (the function, or the parameter class)."""
        return super().get(name)

    def get(self, name: str) -> Callable:
        """The reward ``name`` with its default parameters."""
        return self.build(name, {})

    def build(self, name: str, params: Mapping[str, Any]) -> Callable:
        """The reward ``name`` with ``params``; an unknown parameter is a KeyError naming the allowed ones."""
        factory = self.factory(name)
        allowed = self.parameters(name)
        for key in params:
            if key not in allowed:
                raise KeyError(f"{key}: unknown parameter of reward {name!r}; "
                               f"allowed: {', '.join(allowed) or 'none (it takes no parameters)'}")
        missing = [k for k, (_, default) in allowed.items() if default is dataclasses.MISSING and k not in params]
        if missing:
            raise KeyError(f"{missing[0]}: reward {name!r} needs this parameter (it has no default)")
        if not dataclasses.is_dataclass(factory):
            return factory
        return factory(**params)

    def parameters(self, name: str) -> dict[str, tuple[Any, Any]]:
        """Parameter name -> (annotation, default) of reward ``name``; empty for a plain function."""
        factory = self.factory(name)
        if not dataclasses.is_dataclass(factory):
            return {}
        hints = typing.get_type_hints(factory)
        return {f.name: (hints[f.name], _default(f)) for f in dataclasses.fields(factory) if f.init}


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


REWARDS = RewardRegistry("reward function")


def checked_value(value: object) -> float | None:
    """A reward value as a float, or None; a bool counts as 0 or 1; raises on anything else (text, NaN, inf).

    >>> checked_value(True), checked_value(0), checked_value(None)
    (1.0, 0.0, None)
    """
    if value is None:
        return None
    if not isinstance(value, numbers.Real):  # bool is a Real: True is 1.0
        raise TypeError(f"returned {type(value).__name__} {value!r}, expected a number, a bool or None")
    if not math.isfinite(value):
        raise ValueError(f"returned non-finite value {value!r}")
    return float(value)
