"""``openenv`` (ENVS ``"openenv"``): an OpenEnv environment (the ``openenv-core`` package), driven through its client.

An OpenEnv environment is a server (``openenv.core.env_server.create_app``: FastAPI) and a typed client (a subclass
of ``openenv.core.EnvClient`` whose ``reset`` and ``step`` answer a ``StepResult``: observation, reward, done).
:class:`OpenEnv` plays one episode per trajectory through that client::

    env: {name: openenv, client: my_env.client:MyEnv, app: my_env.server.app:app, reset_fields: [seed]}

- ``client``: the client class. The Action and Observation types it declares (``EnvClient[MyAction, MyObservation,
  State]``) say how the policy's turn becomes an action, ``MyAction(**{action_field: text})``, and which field of
  an observation is its text (``observation_field``); each defaults to the type's only text field (``metadata``,
  ``done`` and ``reward`` aside). ``action`` names the Action class of a client that does not declare it. An
  untyped client (``GenericEnvClient``) sends ``{action_field: text}`` and reads ``observation[observation_field]``:
  both must be named.
- the server: ``base_url``, one already running, or ``app``, an ASGI app (or a function of no arguments that
  returns one) that rlft serves itself (``rlft.envs.served``): uvicorn on 127.0.0.1, on a free port the system
  picks, in a thread of this process; started at the first episode, shared by every trajectory of the process,
  stopped when the run ends or the process exits, the sessions still open closed first.
- ``reset_fields``: fields of the data row passed to the environment's ``reset`` (a list: each under its own name,
  such as ``seed``; a mapping: ``{secret: ground_truth}`` passes the row's ``ground_truth`` as ``secret``), so that
  a group's trajectories play the same episode; the server passes on those its environment's ``reset`` takes.

The reward of each step is ``Step.reward`` (``env_reward`` scores a trajectory by the last one given, ``env_turns``
reads each); ``done`` ends the episode.

Sessions: OpenEnv keeps an episode's state on the server, one environment per WebSocket connection (its HTTP
``/reset`` and ``/step`` routes build a fresh environment per request, so they cannot play an episode of several
steps). Each trajectory opens its own connection at ``reset`` and closes it when its episode ends or when the
rollout drops it (a trajectory cut by a limit). A rollout holds every trajectory of its batch open at once (prompts
x group size), so the server must allow that many sessions: ``create_app(..., max_concurrent_envs=N)``, for an
Environment class marked ``SUPPORTS_CONCURRENT_SESSIONS``. A server of one session (OpenEnv's default) refuses the
others, each refusal costing its trajectory with an error that says so.

Steps run in the trainer's process (not ``runs_in_pool``: a connection does not pickle to a worker); the clients
share one event loop in a daemon thread (``rlft.envs.served.run``). What fails (an unreachable server, a refused session, a server error, a
turn the Action type refuses) raises from ``reset`` or ``step`` with the server's address in the message, and costs
that trajectory (``env/errors``).
"""

from __future__ import annotations

import asyncio
import json
import os
import types
import typing
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from rlft.envs.base import ENVS, EpisodeOver, Step
from rlft.envs.served import local_server, on_stop, run, run_soon
from rlft.userfn import resolve, target

_NOT_TEXT = {"action": ("metadata",), "observation": ("done", "reward", "metadata")}  # never the text field
_CLOSE_S = 5.0  # seconds closing one client's connection may take
_SCHEMES = ("http://", "https://", "ws://", "wss://")
_MISSING = object()


@ENVS.register("openenv")
class OpenEnv:
    """One trajectory's episode of an OpenEnv environment, played through its ``client`` (see the module)."""

    def __init__(self, client: str, base_url: str = "", app: str = "", action: str = "", action_field: str = "",
                 observation_field: str = "", reset_fields: Sequence[str] | Mapping[str, str] = ()):
        base = _client_base()
        self.client_cls = _load("client", client, classes=True)
        if not (isinstance(self.client_cls, type) and issubclass(self.client_cls, base)):
            raise ValueError(f"client: {client!r} is not an openenv.core.EnvClient subclass (the environment's client)")
        if not isinstance(base_url, str) or not isinstance(app, str) or bool(base_url) == bool(app):
            raise ValueError("base_url: give exactly one of base_url (a server already running) and app (an ASGI app "
                             "rlft serves itself), each a string")
        if base_url and not base_url.startswith(_SCHEMES):
            raise ValueError(f"base_url: expected an http://, https://, ws:// or wss:// address, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.app_target = _target("app", app) if app else ""
        self.app = _load("app", app) if app else None
        declared_action, declared_observation = declared_types(self.client_cls)
        if action:
            declared_action = _load("action", action, classes=True)
            if not _is_model(declared_action):
                raise ValueError(f"action: {action!r} is not a pydantic model (an openenv Action class)")
        self.action_type = declared_action if _is_model(declared_action) else None
        self.action_field = text_field("action", action_field, self.action_type)
        self.observation_field = text_field("observation", observation_field,
                                            declared_observation if _is_model(declared_observation) else None)
        if self.action_type is not None:
            others = [k for k, f in self.action_type.model_fields.items() if f.is_required() and k != self.action_field]
            if others:
                raise ValueError(f"action_field: {self.action_type.__name__} also requires {', '.join(others)}, which "
                                 f"rlft cannot fill from the policy's turn")
        self.reset_fields = reset_arguments(reset_fields)
        self.url = self.base_url
        self._client: Any = None
        self._closer: weakref.finalize | None = None
        self.done = True

    def reset(self, sample: Mapping[str, Any]) -> str | None:
        """Open a session on the server and start its episode with ``reset_fields`` of ``sample``; the observation's
        text is the first observation (None when it is empty)."""
        self.close()
        kwargs = {arg: field_of(sample, key) for arg, key in self.reset_fields.items()}
        self.url = self.base_url or local_server(self.app_target, self.app).url
        try:
            client = self.client_cls(base_url=self.url)
        except Exception as e:  # noqa: BLE001  the user's client refused its arguments
            raise ValueError(f"client: {self.client_cls.__name__}(base_url=...) failed: {type(e).__name__}: {e}") from e
        self._client = client
        self._closer = weakref.finalize(self, _close_client, client)  # when the rollout drops this trajectory
        _OPEN.add(self)
        result = self._call(client.reset(**kwargs), "reset")
        self.done = bool(result.done)
        return self._text(result.observation) or None

    def step(self, action_text: str) -> Step:
        """Send the policy's turn as an action; the environment's observation, reward and done."""
        if self._client is None or self.done:
            raise EpisodeOver("step before reset() or after the episode ended")
        result = self._call(self._client.step(self._action(action_text)), "step")
        self.done = bool(result.done)
        text = self._text(result.observation)
        reward = float(result.reward) if isinstance(result.reward, bool) else result.reward
        if self.done:
            self.close()
        return Step(text, reward, self.done, {})

    def close(self) -> None:
        """Close this trajectory's session (its connection to the server); nothing when none is open."""
        if self._closer is not None:
            self._closer()
        self._client, self._closer = None, None

    def _call(self, coro: Any, what: str) -> Any:
        try:
            return run(coro)
        except BaseException as e:
            said = _server_said(self._client) if _closed_by_server(e) else ""
            self.close()  # a failed session is not used again; the server frees its slot
            if not isinstance(e, Exception):
                raise
            raise RuntimeError(_explained(e, what, self.url, said)) from e

    def _action(self, text: str) -> Any:
        if self.action_type is None:
            return {self.action_field: text}
        try:
            return self.action_type(**{self.action_field: text})
        except Exception as e:  # noqa: BLE001  pydantic's ValidationError: the turn breaks the Action's constraints
            first = getattr(e, "errors", lambda: [{"msg": str(e)}])()[0].get("msg", str(e))
            raise ValueError(f"the policy's turn is not a valid {self.action_type.__name__}.{self.action_field}: "
                             f"{first}") from None

    def _text(self, observation: Any) -> str | None:
        key = self.observation_field
        value = observation.get(key, _MISSING) if isinstance(observation, Mapping) else getattr(observation, key,
                                                                                               _MISSING)
        if value is _MISSING:
            raise ValueError(f"observation_field: the {type(observation).__name__} the server answered has no field "
                             f"{key!r}")
        if value is not None and not isinstance(value, str):
            raise TypeError(f"observation_field: the observation's {key!r} is a {type(value).__name__}, not text")
        return value


def declared_types(client_cls: type) -> tuple[Any, Any]:
    """The Action and Observation types ``client_cls`` declares (``EnvClient[Act, Obs, State]``), else (None, None).

    >>> declared_types(object)
    (None, None)
    """
    base = _client_base() if isinstance(client_cls, type) and client_cls is not object else None
    for klass in getattr(client_cls, "__mro__", ()):
        for parent in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(parent)
            if base is not None and isinstance(origin, type) and issubclass(origin, base):
                args = typing.get_args(parent)
                if len(args) >= 2 and not any(isinstance(a, typing.TypeVar) for a in args[:2]):
                    return args[0], args[1]
    return None, None


def text_field(kind: str, given: str, model: Any) -> str:
    """The field of ``kind`` ("action" or "observation") that holds text: ``given`` when it is a field of ``model``
    (any name when ``model`` is None: an untyped client's dicts), else the model's only text field; a ValueError
    naming ``{kind}_field`` otherwise.

    >>> from pydantic import BaseModel
    >>> class Move(BaseModel):
    ...     message: str
    ...     metadata: dict = {}
    >>> text_field("action", "", Move), text_field("observation", "text", None)
    ('message', 'text')
    """
    key = f"{kind}_field"
    if not isinstance(given, str):
        raise ValueError(f"{key}: expected a field name, got {type(given).__name__} {given!r}")
    if model is None:
        if not given:
            raise ValueError(f"{key}: the client does not declare its {kind} type (an untyped client such as "
                             f"GenericEnvClient), so name the field that holds the text")
        return given
    fields = model.model_fields
    if given:
        if given not in fields:
            raise ValueError(f"{key}: {given!r} is not a field of {model.__name__}; its fields: {', '.join(fields)}")
        return given
    texts = [k for k, f in fields.items() if k not in _NOT_TEXT[kind] and _is_text(f.annotation)]
    if len(texts) != 1:
        found = f"{len(texts)} text fields ({', '.join(texts)})" if texts else "no text field"
        raise ValueError(f"{key}: {model.__name__} has {found}; name the one that holds the "
                         f"{'turn' if kind == 'action' else 'text shown to the policy'}")
    return texts[0]


def reset_arguments(given: Any) -> dict[str, str]:
    """``reset_fields`` as {argument of reset: field of the data row}: a list passes each field under its own name.

    >>> reset_arguments(["seed"]), reset_arguments({"secret": "ground_truth"})
    ({'seed': 'seed'}, {'secret': 'ground_truth'})
    """
    pairs = list(given.items()) if isinstance(given, Mapping) else (
        None if isinstance(given, str) or not isinstance(given, Sequence) else [(k, k) for k in given])
    if pairs is None or not all(isinstance(a, str) and a.isidentifier() and isinstance(k, str) and k
                                for a, k in pairs):
        raise ValueError(f"reset_fields: expected a list of the data row's fields, or a mapping of reset's arguments "
                         f"to them, got {given!r}")
    return dict(pairs)


def field_of(sample: Mapping[str, Any], key: str) -> Any:
    """``sample[key]``, else the data row's own field ``key`` (``sample["extra"]``); a ValueError naming it.

    >>> field_of({"ground_truth": "7", "extra": {"seed": 3}}, "seed")
    3
    """
    if key in sample:
        return sample[key]
    extra = sample.get("extra")
    if isinstance(extra, Mapping) and key in extra:
        return extra[key]
    raise ValueError(f"reset_fields: the data row has no field {key!r}")


def _is_text(annotation: Any) -> bool:
    if annotation is str:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return str in args and all(a is str or a is type(None) for a in args)
    return False


def _is_model(obj: Any) -> bool:
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover  (openenv-core requires pydantic)
        return False
    return isinstance(obj, type) and issubclass(obj, BaseModel)


def _client_base() -> type:
    try:
        from openenv.core.env_client import EnvClient
    except ImportError as e:
        raise ValueError(f"client: the openenv environment needs openenv-core (pip install 'rlft[openenv]'): {e}") \
            from None
    return EnvClient


def _load(key: str, spec: Any, classes: bool = False) -> Any:
    """The object at ``spec`` (``package.module:Name`` or ``path/to/file.py:Name``); a ValueError naming ``key``."""
    try:
        return resolve(_target(key, spec), spec, classes=classes)
    except ValueError as e:
        raise _renamed(e, key) from None


def _target(key: str, spec: Any) -> str:
    """``spec`` as :func:`rlft.userfn.target` gives it (a file's absolute path); a ValueError naming ``key``."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"{key}: expected package.module:Name or path/to/file.py:Name, got {spec!r}")
    try:
        return target(spec, "Name")
    except ValueError as e:
        raise _renamed(e, key) from None


def _renamed(e: ValueError, key: str) -> ValueError:
    text = str(e)
    return ValueError(f"{key}: {text[4:] if text.startswith('fn: ') else text}")


def _closed_by_server(e: BaseException) -> bool:
    """Whether ``e`` is the connection closed under the client (websockets' ConnectionClosed)."""
    try:
        from websockets.exceptions import ConnectionClosed
    except ImportError:  # pragma: no cover  (openenv-core requires websockets)
        return False
    return isinstance(e, ConnectionClosed)


def _server_said(client: Any) -> str:
    """The error message the server sent before it closed the connection (a refused session), else ""."""
    ws = getattr(client, "_ws", None)
    if ws is None:
        return ""
    try:
        message = json.loads(run(asyncio.wait_for(ws.recv(), 0.5)))
    except Exception:  # noqa: BLE001  nothing left to read
        return ""
    data = message.get("data") if isinstance(message, dict) and message.get("type") == "error" else None
    return f"{data.get('message', '')} (code: {data.get('code', '')})" if isinstance(data, dict) else ""


def _explained(e: Exception, what: str, url: str, said: str = "") -> str:
    """What the failure of a ``reset`` or ``step`` of the server at ``url`` says (a refused session explained);
    ``said``: the server's own error message, when it sent one before closing the connection."""
    text = f"{type(e).__name__}: {e}" + (f"; the server said: {said}" if said else "")
    if "CAPACITY_REACHED" in text:
        return (f"the OpenEnv server at {url} refused a session ({said or e}): it allows fewer sessions at once than "
                f"the rollout has trajectories; build its app with create_app(..., max_concurrent_envs=N), N at "
                f"least prompts x group size")
    if isinstance(e, (ConnectionError, OSError)):
        return f"cannot reach the OpenEnv server at {url} ({what}): {text}"
    return f"the OpenEnv server at {url} failed a {what}: {text}"


_OPEN: weakref.WeakSet = weakref.WeakSet()  # the environments of this process with a session open


def _close_client(client: Any) -> None:
    """Close ``client``'s session (best effort: the server drops the session once the connection closes)."""
    run_soon(_closed(client), _CLOSE_S)


async def _closed(client: Any) -> None:
    """Close ``client``'s session as OpenEnv's server expects: a ``close`` message, then the server closes the
    connection (``EnvClient.close`` closes it at once, and the server, closing it too, logs an error each time)."""
    ws = getattr(client, "_ws", None)
    if ws is not None:
        try:
            await client._send({"type": "close"})
            await asyncio.wait_for(ws.wait_closed(), _CLOSE_S)
        except Exception:  # noqa: BLE001  best effort: closing below ends the session all the same
            pass
    await client.close()


def _close_sessions() -> None:
    """Close the sessions still open, before the servers stop (as the rollout would have)."""
    for env in list(_OPEN):
        env.close()


def _forget_after_fork() -> None:
    """In a forked child: the parent's connections are not this process's to close."""
    for env in list(_OPEN):
        if env._closer is not None:
            env._closer.detach()
        env._client, env._closer = None, None


on_stop(_close_sessions)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
