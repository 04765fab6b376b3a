"""The environment's side of a multi-turn rollout: start each trajectory's environment, step the environments of
every row a turn paused, all together, and append each answer to its trajectory.

A turn of the rollout samples every unfinished row (``rlft.rollout.multiturn``), then :func:`step_envs` steps the
environment of every row that needs an answer. Fast environments step here, one after the other, each under
``env.deadline_s`` (``call_with_timeout``: a ``SIGALRM`` deadline). Slow ones (marked ``runs_in_pool``:
``rlft.envs.base.steps_in_pool``) step concurrently in the worker processes of the active reward pool
(``rlft.rewards.pool.active_pool``), each a task with the same deadline, while the fast ones step here: the
environment goes to a worker pickled with the turn's text and comes back pickled with its ``Step``, and the copy
that came back replaces the trainer's (a deterministic environment ends where it would have ended stepped here:
same trajectories, same order). Without an active pool every environment steps here.

In a worker, as here, a failure costs that trajectory only (``env/errors``): a step that raises, runs past its
deadline (the worker is stopped and replaced), kills its worker (``os._exit``, a segfault), or answers with
something that is not a ``Step`` of text. An environment marked slow that does not pickle costs its trajectory
too, with an error that says so (``rlft train`` refuses one at its start: ``rlft.rewards.terms.reward_pool``).

``tr`` below is a ``rlft.rollout.multiturn.Trajectory``, ``limits`` its ``TurnLimits`` and ``render`` its
``Renderer`` (that module imports this one).
"""

from __future__ import annotations

import math
import pickle
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from rlft.envs.base import error_text, step_in_worker, steps_in_pool
from rlft.rewards import call_with_timeout
from rlft.rewards.pool import RewardPool, active_pool, result
from rlft.userfn import FILE_MODULE



class Paused(NamedTuple):
    """A row's turn that the environment answers: its ``text``, its token ``ids`` and whether it ended the
    policy's message (its end-of-turn token) rather than pausing it (a stop text)."""

    text: str
    ids: list[int]
    ended_message: bool


class Answer(NamedTuple):
    """An environment's answer to a turn: its ``step`` (what ``Env.step`` returned), or ``error``, why the step
    cost the trajectory."""

    step: Any
    error: str | None


def step_envs(envs: list[Any], actions: Sequence[tuple[int, str]], deadline_s: float) -> list[Answer]:
    """The answer of ``envs[row]`` to ``text`` for every ``(row, text)`` of ``actions``, in order; slow environments
    step in the active pool's workers (``envs[row]`` replaced by the copy that stepped), the others here."""
    pool = active_pool()
    sent = {k: _send(pool, envs[row], text, deadline_s) for k, (row, text) in enumerate(actions)
            if pool is not None and steps_in_pool(envs[row])}
    answers = [None if k in sent else _here(envs[row], text, deadline_s) for k, (row, text) in enumerate(actions)]
    for k, future in sent.items():  # the workers ran while the fast ones stepped here
        env, answers[k] = _back(future, deadline_s)
        if env is not None:
            envs[actions[k][0]] = env
    return answers


def _here(env: Any, text: str, deadline_s: float) -> Answer:
    try:
        return Answer(call_with_timeout(env.step, (text,), deadline_s), None)
    except BaseException as e:  # noqa: BLE001  the environment's failure costs this trajectory only
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return Answer(None, error_text(e))


def _send(pool: RewardPool, env: Any, text: str, deadline_s: float) -> Any:
    """The pool's task stepping ``env``, or the Answer that says why ``env`` cannot go to a worker."""
    try:
        blob = pickle.dumps(env)
    except Exception as e:  # noqa: BLE001
        return Answer(None, error_text(TypeError(f"the environment is marked runs_in_pool but does not pickle, so "
                                                 f"it cannot step in a worker: {e}")))
    return pool.submit(step_in_worker, (blob, text, _source(env)), deadline_s)


def _source(env: Any) -> str:
    """``/abs/file.py:Class`` when ``env``'s class was imported from a file named by path (``env.fn``), which a
    worker cannot import by the module's name; else ""."""
    cls = type(env)
    if not cls.__module__.startswith(FILE_MODULE):
        return ""
    return f"{getattr(sys.modules.get(cls.__module__), '__file__', '')}:{cls.__qualname__}"


def _back(future: Any, deadline_s: float) -> tuple[Any, Answer]:
    """(the environment after its step, its Answer) from a worker; (None, the failure) when the step failed."""
    if isinstance(future, Answer):
        return None, future
    try:
        env, step, error = pickle.loads(result(future, deadline_s))
    except Exception as e:  # noqa: BLE001  past the deadline, a dead worker, an answer that does not unpickle
        return None, Answer(None, error_text(e))
    return env, Answer(step, error)


def open_env(make_env: Callable[[Mapping[str, Any]], Any], sample: Mapping[str, Any], limits: Any
             ) -> tuple[Any, str | None]:
    """(a new environment for ``sample``, its first observation or None), each call under ``limits.deadline_s``;
    raises what building or resetting raised, or a TypeError / ValueError for an observation that is not text or
    is longer than ``limits.max_observation_chars``."""
    env = call_with_timeout(make_env, (sample,), limits.deadline_s)
    first = call_with_timeout(env.reset, (sample,), limits.deadline_s)
    return env, _checked(first, limits, allow_none=True)


def start_env(tr: Any, make_env: Callable[[Mapping[str, Any]], Any], sample: Mapping[str, Any], limits: Any,
              render: Any) -> Any:
    """A new environment for trajectory ``tr``; its first observation joins the conversation before the first
    turn. None when building or resetting it failed (the trajectory ends, its error recorded)."""
    try:
        env, first = open_env(make_env, sample, limits)
    except BaseException as e:  # noqa: BLE001  an environment that raises or hangs costs its trajectory
        _failed(tr, e)
        return None
    if first is not None and render.chat:  # the opening message gains it: the prompt is re-rendered, unsampled
        tr.prompt = render.opening(tr, first)
        tr.add([], "env", first)
    elif first is not None:
        ids = render.encode(first)
        if len(tr.prompt) + len(ids) >= limits.max_tokens:  # no room for a turn after it: shown, not trained on
            tr.done = tr.truncated = True
            tr.add([], "env", first)
            return env
        tr.add(ids, "env", first)
    return env


def answer(tr: Any, turn: Paused, got: Answer, limits: Any, render: Any, roles: Sequence[str]) -> None:
    """Append the environment's answer ``got`` to ``turn`` (the last turn of trajectory ``tr``): its reward, and
    its observation's tokens unless the episode ended; a failed step or an observation that is not text ends the
    trajectory, unscored."""
    if got.error is not None:
        tr.done, tr.error = True, got.error
        return
    try:
        step = got.step
        observation = _checked(step.observation, limits, allow_none=True)
        reward, done, info = step.reward, step.done, step.info
        if roles:
            _next_role(tr, info, roles)
    except BaseException as e:  # noqa: BLE001  the environment's failure costs this trajectory only
        _failed(tr, e)
        return
    _count_tools(tr, info)
    if reward is not None:
        tr.reward = reward
        tr.turn_rewards.append((len(tr.ids) - 1, reward))  # at the turn's last token
    if done or tr.turns >= limits.max_turns:
        tr.done = True
        tr.truncated = not done
        if observation:  # shown in samples and reports; no policy token follows, so it is not trained on
            tr.add([], "env", observation)
        return
    try:
        obs = render.observation(tr, turn.ids, turn.ended_message, observation or "")
    except ValueError as e:
        _failed(tr, e)
        return
    if len(tr.prompt) + len(tr.ids) + len(obs) >= limits.max_tokens:  # no room left for the policy to answer
        tr.done = tr.truncated = True
        tr.add([], "env", observation or "")
        return
    tr.open_turn = [] if turn.ended_message else tr.open_turn + obs
    tr.add(obs, "env", observation or "")


def _next_role(tr: Any, info: Mapping[str, Any], roles: Sequence[str]) -> None:
    """Multi-agent bookkeeping of one step: the roles' verdicts it gives (``info["role_rewards"]``) and who writes
    next (``info["next_role"]``, else the next role in order); a ValueError for a role or reward that is not."""
    given = info.get("role_rewards") if isinstance(info, Mapping) else None
    if given is not None and not isinstance(given, Mapping):
        raise ValueError(f"role_rewards must map roles to rewards, got {type(given).__name__}")
    for role, value in (given or {}).items():
        if role not in roles:
            raise ValueError(f"role_rewards names {role!r}, not one of the roles {list(roles)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"role_rewards[{role!r}] = {value!r} is not a finite number")
        tr.role_rewards[role] = float(value)
    named = info.get("next_role") if isinstance(info, Mapping) else None
    if named is not None and named not in roles:
        raise ValueError(f"next_role {named!r} is not one of the roles {list(roles)}")
    tr.next_role = roles.index(named) if named is not None else (tr.next_role + 1) % len(roles)


def _checked(observation: Any, limits: Any, *, allow_none: bool) -> str | None:
    if observation is None and allow_none:
        return None
    if not isinstance(observation, str):
        raise TypeError(f"observation is a {type(observation).__name__}, not text")
    if len(observation) > limits.max_observation_chars:
        raise ValueError(f"observation of {len(observation)} characters, over env.max_observation_chars="
                         f"{limits.max_observation_chars}")
    return observation


def _failed(tr: Any, e: BaseException) -> None:
    if isinstance(e, (KeyboardInterrupt, SystemExit)):
        raise e
    tr.done = True
    tr.error = error_text(e)


def _count_tools(tr: Any, info: Mapping[str, Any]) -> None:
    tool = info.get("tool") if isinstance(info, Mapping) else None
    if isinstance(info, Mapping) and ("calls" in info or tool):
        if tool:
            tr.tools[str(tool)] += 1
        elif info.get("error"):
            tr.malformed += 1
        if info.get("error"):
            tr.tool_errors += 1
