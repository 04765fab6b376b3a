"""A black-box agent as an environment: the user's own code plays each episode against an OpenAI-compatible endpoint.

``env: {name: agent, entry: my_agent.py:run, max_turns: 4, timeout_s: 120}``. The agent is a function
``run(task, endpoint)`` (or ``async def``), unchanged apart from where its client points:

- ``task``: the data row, a plain dict: ``prompt`` (text or chat messages, as the data gave it), ``messages`` (the
  prompt as OpenAI chat messages), ``answer`` (the reference answer; also under ``ground_truth``), ``data_source``
  and ``extra`` (the row's other fields);
- ``endpoint``: an :class:`Endpoint` with ``base_url``, ``api_key`` and ``model``, what an ``openai.OpenAI`` client
  (or any OpenAI-compatible client) is built from. Each episode gets its own ``base_url``: the gateway
  (``rlft.gateway``) records every call made through it as that episode's session;
- it returns the episode's reward: a number, or a dict with ``reward`` and optionally ``info`` (a dict kept in the
  episode's record).

Whatever the agent does wrong (raises, hangs past ``timeout_s``, returns something else, never calls the model)
costs its episode, counted; the run goes on. This module holds the contract (:class:`AgentSpec`, :class:`Endpoint`,
:func:`play`); the gateway and the rollout that run it live in ``rlft.gateway`` and ``rlft.rollout.agent``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import numbers
import threading
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlft.envs.base import ENVS, check_int, error_text
from rlft.userfn import resolve, target


@dataclass(frozen=True)
class Endpoint:
    """Where an agent's OpenAI client points for one episode: ``OpenAI(base_url=..., api_key=...)`` and the
    ``model`` to name in its requests."""

    base_url: str
    api_key: str
    model: str


@ENVS.register("agent")
@dataclass(frozen=True)
class AgentSpec:
    """The parameters of ``env: {name: agent}``: ``entry`` (``package.module:run`` or ``path/to/file.py:run``),
    ``timeout_s`` (seconds one episode may take, model calls included) and ``workers`` (processes the episodes
    run in, each running its share of them concurrently, one thread an episode)."""

    entry: str
    timeout_s: float = 120.0
    workers: int = 2
    black_box: ClassVar[bool] = True  # played through the gateway (rlft.rollout.agent), not stepped by reset/step

    def __post_init__(self):
        if not isinstance(self.entry, str) or not self.entry:
            raise ValueError("entry: missing: name the agent's function, e.g. my_agent.py:run or my_pkg.agent:run")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, numbers.Real) or \
                not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise ValueError(f"timeout_s: must be a positive number of seconds, got {self.timeout_s!r}")
        check_int("workers", self.workers, low=1, high=64)

    @property
    def target(self) -> str:
        """The entry as :func:`rlft.userfn.resolve` imports it (a file named by path made absolute)."""
        return target(self.entry, "run")

    def agent(self) -> str:
        """What a worker process calls for each episode: the entry, imported there (``resolve``)."""
        return self.target

    def check(self) -> None:
        """A ValueError naming ``entry`` when it does not import as a function of two arguments."""
        self.function()

    def function(self) -> Callable[..., Any]:
        """The agent's function; a ValueError naming ``entry`` when it is missing or not callable."""
        try:
            fn = resolve(self.target, self.entry)
        except ValueError as e:
            raise ValueError(f"entry: {e}") from None
        parameters = _positional(fn)
        if parameters is not None and parameters < 2:
            raise ValueError(f"entry: {self.entry!r} must take (task, endpoint), it takes {parameters} argument(s)")
        return fn


def _positional(fn: Callable) -> int | None:
    """How many positional arguments ``fn`` takes (None: any number, or no signature to read)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def task_of(sample: Mapping[str, Any], messages: list[dict]) -> dict[str, Any]:
    """The ``task`` an agent receives for a data row ``sample`` (``Example.to_mapping``) whose prompt, as chat
    messages, is ``messages``.

    >>> task_of({"prompt": "2+2?", "ground_truth": "4", "data_source": "s", "extra": {}},
    ...         [{"role": "user", "content": "2+2?"}])["answer"]
    '4'
    """
    return {"prompt": sample.get("prompt"), "messages": [dict(m) for m in messages],
            "answer": sample.get("ground_truth"), "ground_truth": sample.get("ground_truth"),
            "data_source": sample.get("data_source", ""), "extra": dict(sample.get("extra") or {})}


def outcome(value: Any) -> tuple[float, dict]:
    """``(reward, info)`` of what an agent returned; a TypeError or ValueError saying what is wrong otherwise.

    >>> outcome(1), outcome({"reward": 0.5, "info": {"turns": 2}})
    ((1.0, {}), (0.5, {'turns': 2}))
    >>> outcome("yes")
    Traceback (most recent call last):
    TypeError: the agent returned str 'yes': expected a number or a dict with 'reward' (and optional 'info')
    """
    info: Any = {}
    reward = value
    if isinstance(value, Mapping):
        if "reward" not in value:
            raise TypeError(f"the agent returned a dict without 'reward' (keys: {', '.join(map(str, value))})")
        unknown = set(value) - {"reward", "info"}
        if unknown:
            raise TypeError(f"the agent returned a dict with unknown keys: {', '.join(sorted(map(str, unknown)))} "
                            "(expected 'reward' and optional 'info')")
        reward, info = value["reward"], value.get("info") or {}
        if not isinstance(info, Mapping):
            raise TypeError(f"the agent's 'info' must be a dict, got {type(info).__name__}")
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        raise TypeError(f"the agent returned {type(reward).__name__} {str(reward)[:40]!r}: expected a number or a "
                        "dict with 'reward' (and optional 'info')")
    if not math.isfinite(reward):
        raise ValueError(f"the agent's reward must be finite, got {reward!r}")
    return float(reward), dict(info)


def play(fn: Callable[..., Any], task: dict[str, Any], endpoint: Endpoint) -> tuple[float, dict]:
    """One episode: ``fn(task, endpoint)`` (awaited when it is a coroutine function or returns an awaitable), its
    result read by :func:`outcome`. Exceptions go to the caller, which counts the lost episode."""
    result = fn(task, endpoint)
    if inspect.isawaitable(result):
        result = asyncio.run(_awaited(result))
    return outcome(result)


async def _awaited(awaitable):
    return await awaitable


def run_episodes(agent: str | Callable[..., Any], episodes: list[tuple[dict, Endpoint, str]], key: str) -> None:
    """A worker process's share of a rollout's episodes, each in a thread of its own: ``agent`` (an entry to
    import, or a picklable function) plays ``(task, endpoint, end_url)``, and the outcome (``{"reward", "info"}``,
    or ``{"error"}`` with what went wrong) is posted to ``end_url``, the gateway's record of the episode. The
    gateway enforces the deadlines; a thread still running when the rollout ends goes with its process."""
    try:
        fn = resolve(agent, agent) if isinstance(agent, str) else agent
    except BaseException as e:  # noqa: BLE001  every episode of this share is lost, and says why
        failure = error_text(e)
        for _, _, end_url in episodes:
            _post(end_url, {"error": f"the agent did not import: {failure}"}, key)
        return
    threads = [threading.Thread(target=_episode, args=(fn, task, endpoint, end_url, key), daemon=True)
               for task, endpoint, end_url in episodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _episode(fn: Callable[..., Any], task: dict, endpoint: Endpoint, end_url: str, key: str) -> None:
    try:
        reward, info = play(fn, task, endpoint)
        body = {"reward": reward, "info": info}
    except BaseException as e:  # noqa: BLE001  the agent's failure costs its episode only
        body = {"error": error_text(e)}
    _post(end_url, body, key)


def _post(url: str, body: dict, key: str) -> None:
    data = json.dumps(body, default=str).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=30).read()
    except OSError:  # the rollout is over (its gateway gone): nobody is waiting for this outcome
        pass
