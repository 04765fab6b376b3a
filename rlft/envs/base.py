"""The environment interface of multi-turn rollouts: ``Env``, the ``Step`` it answers with, and ``ENVS``.

One trajectory is a conversation between the policy and an environment:

1. ``env = ENVS.get(name)(**params)``: a fresh environment for this trajectory (its state is this trajectory's
   only); ``params`` are plain values, as a YAML recipe gives them, and a bad one is a ``ValueError`` naming it;
2. ``env.reset(sample)``: the first observation (text added to the conversation after the prompt), or None;
3. the policy writes a turn; ``env.step(turn)`` answers with a :class:`Step`; while ``step.done`` is False the
   observation is added to the conversation and the policy writes again.

What the model does wrong (a malformed tool call, a guess that is not a number) is answered inside a ``Step``,
never raised: the model learns from the observation. What the caller does wrong (a step after the episode
ended, a sample without the fields an environment needs) raises.

An environment whose steps are slow (a tool that runs a program, a call to a remote API) says so with the mark slow
rewards carry: ``runs_in_pool = True`` in its class (or a property, where its parameters decide: ``ToolEnv`` is slow
exactly when one of its tools is). While a reward pool is active (``rlft.rewards.pool``) the rollout steps such
environments in the pool's worker processes, all paused rows at once (``rlft.rollout.env_steps``); the environment
travels there and back pickled, so it must pickle (module-level classes; plain data, or a ``__getstate__``).
"""

from __future__ import annotations

import math
import numbers
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

from rlft.registry import Registry


@dataclass(frozen=True)
class Step:
    """An environment's answer to one turn of the policy.

    ``observation``: text the environment adds to the conversation (None: nothing); ``reward``: the trajectory's
    reward, set by environments that score the outcome themselves (a game won or lost), None when the run's
    reward functions score the final text; ``done``: the episode is over; ``info``: what happened, for logs and
    metrics (e.g. ``{"tool": "calculator", "error": "division by zero"}``), a copy of the mapping given (a plain
    dict, so that a step pickles to another process).
    """

    observation: str | None
    reward: float | None
    done: bool
    info: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.observation is not None and not isinstance(self.observation, str):
            raise TypeError(f"observation: expected str or None, got {type(self.observation).__name__}")
        if not isinstance(self.done, bool):
            raise TypeError(f"done: expected bool, got {type(self.done).__name__}")
        if self.reward is not None:
            if isinstance(self.reward, bool) or not isinstance(self.reward, numbers.Real):
                raise TypeError(f"reward: expected a float or None, got {type(self.reward).__name__}")
            if not math.isfinite(self.reward):
                raise ValueError(f"reward: must be finite, got {self.reward!r}")
            object.__setattr__(self, "reward", float(self.reward))
        if not isinstance(self.info, Mapping):
            raise TypeError(f"info: expected a mapping, got {type(self.info).__name__}")
        object.__setattr__(self, "info", dict(self.info))


@runtime_checkable
class Env(Protocol):
    """One trajectory's environment. A class need not inherit from it; having both methods is enough."""

    def reset(self, sample: Mapping[str, Any]) -> str | None:
        """Start the episode for ``sample`` (a data row); the first observation, or None."""
        ...

    def step(self, action_text: str) -> Step:
        """Answer the policy's latest turn ``action_text``."""
        ...


def steps_in_pool(env: Any) -> bool:
    """Whether ``env``'s steps are slow: it is marked ``runs_in_pool`` (see the module's docstring).

    >>> class Api:
    ...     runs_in_pool = True
    >>> steps_in_pool(Api()), steps_in_pool(object())
    (True, False)
    """
    return getattr(env, "runs_in_pool", False) is True


def error_text(e: BaseException) -> str:
    """How an environment's failure is recorded on its trajectory: the exception's type and its message's start.

    >>> error_text(ValueError("no such room"))
    'ValueError: no such room'
    """
    return f"{type(e).__name__}: {str(e)[:200]}"


def step_in_worker(blob: bytes, action_text: str, source: str = "") -> bytes:
    """One step of a slow environment, in a worker process of the reward pool (``rlft.rollout.env_steps``).

    ``blob``: the pickled environment; ``source``: ``/abs/file.py:Class`` when its class was loaded from a file
    named by path (``env.fn=path/to/file.py:Name``), imported first as the trainer imported it. The answer is the
    pickled ``(environment after the step, Step, None)``, or ``(None, None, error)`` with the failure described
    as :func:`error_text` does: described here, since an exception need not pickle back.
    """
    try:
        if source:
            from rlft.userfn import resolve

            resolve(source, source, classes=True)
        env = pickle.loads(blob)
        step = env.step(action_text)
    except BaseException as e:  # noqa: BLE001  the environment's failure costs its trajectory only
        return pickle.dumps((None, None, error_text(e)))
    try:
        return pickle.dumps((env, step, None))
    except Exception as e:  # noqa: BLE001
        return pickle.dumps((None, None, error_text(TypeError(f"the environment or its step does not pickle "
                                                              f"back from the worker: {e}"))))


ENVS: Registry[Callable[..., Env]] = Registry("environment")


class EpisodeOver(RuntimeError):
    """``step`` was called after the episode ended (or before ``reset``): the caller's mistake, not the model's."""


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` when it is an int (not a bool) in ``[low, high]``; else ``ValueError`` naming ``name``.

    >>> check_int("max_calls", 3, low=1)
    3
    >>> check_int("max_calls", True, low=1)
    Traceback (most recent call last):
    ValueError: max_calls: expected an integer, got bool True
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an integer, got {type(value).__name__} {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"from {low} to {high}" if low is not None and high is not None else (
            f"at least {low}" if low is not None else f"at most {high}")
        raise ValueError(f"{name}: must be {bounds}, got {value}")
    return value
