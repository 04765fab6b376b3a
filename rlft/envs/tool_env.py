"""``ToolEnv`` (ENVS ``"tools"``): the model calls tools in the plain-text protocol of :mod:`rlft.envs.tools`
(``protocol="text"``, the default) or in the chat template's own format, JSON in ``<tool_call>`` tags
(``protocol="json"``, :mod:`rlft.envs.tool_json`; the prompt then shows the tools' schemas: :meth:`ToolEnv.schemas`).

Each turn that holds a call is answered (text: the tool's ``<result>`` or an ``<error>``; json: a message with the
output of each call the turn holds, in order) and the episode goes on; the first turn without a call is the final
answer: the episode ends with reward None, so the run's reward functions score the final text. A malformed call
counts as a call (a model that only writes broken calls still ends), and once ``max_calls`` calls were made the
next one is refused and ends the episode: an episode has at most ``max_calls + 1`` turns.

Its steps are slow (``runs_in_pool``: stepped in the reward pool's workers) when one of its tools is: a tool whose
function is marked ``runs_in_pool`` (a class attribute, or ``rlft.rewards.pool.runs_in_pool`` on a function), as
the python tool's is.

``info`` of every step: ``tool`` (the tool that ran, else None), ``error`` (the message the model read, else
None), ``calls`` and ``errors`` (counts so far in this episode). A json turn with several calls counts each in
``calls`` and ``errors``; its ``tool`` is the last tool that ran and its ``error`` the first error.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from rlft.envs.base import ENVS, EpisodeOver, Step, check_int
from rlft.envs.tool_json import Answer, parse_calls, render_answers
from rlft.envs.tools import (MAX_CHARS, TOOLS, Call, Tool, ToolError, clip, parse_call, render_error, render_result,
                             schema)


def _text_calls(text: str, tools: Mapping[str, Tool]) -> list[Call | ToolError]:
    """The plain-text protocol's call (it reads one a turn: the call the text ends on) as a list."""
    try:
        call = parse_call(text, tools)
    except ToolError as e:
        return [ToolError(str(e) or "malformed call")]
    return [] if call is None else [call]


def _text_answer(answers: Sequence[Answer], max_chars: int) -> str:
    (a,) = answers
    return render_result(a.output, max_chars) if a.error is None else render_error(a.error, max_chars)


class Protocol(NamedTuple):
    """How calls are written: ``read(text, tools)`` gives a turn's calls in order (a :class:`ToolError` for one
    that cannot be made), ``render(answers, max_chars)`` the observation answering them."""

    read: Callable[[str, Mapping[str, Tool]], list[Call | ToolError]]
    render: Callable[[Sequence[Answer], int], str]


PROTOCOLS = {"text": Protocol(_text_calls, _text_answer), "json": Protocol(parse_calls, render_answers)}


@ENVS.register("tools")
class ToolEnv:
    """Tools for one trajectory. ``tools``: names in ``TOOLS``, or mappings ``{"name": NAME, **parameters}``
    for factories that take parameters (``{"name": "lookup", "path": "docs.jsonl", "k": 3}``), checked against
    the factory's signature; ``max_calls``: calls allowed per episode; ``max_chars``: a result or error longer
    than this is cut (marked ``...[cut]``); ``protocol``: ``text`` (``<call>NAME: ARGUMENTS</call>``) or ``json``
    (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, the chat template's format)."""

    def __init__(self, tools: Sequence[str | Mapping[str, Any]] = ("calculator",), max_calls: int = 4,
                 max_chars: int = MAX_CHARS, protocol: str = "text"):
        self.tools: dict[str, Tool] = {name: _build(name, params) for name, params in _tool_specs(tools)}
        self.max_calls = check_int("max_calls", max_calls, low=1)
        self.max_chars = check_int("max_chars", max_chars, low=1)
        if not isinstance(protocol, str) or protocol not in PROTOCOLS:
            raise ValueError(f"protocol: expected one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        self.protocol = protocol
        self.calls = self.errors = 0
        self.done = False

    @property
    def runs_in_pool(self) -> bool:
        """Whether the steps are slow, so that they run in the reward pool's workers (``rlft.envs.base``): when
        one of the tools is, its function marked ``runs_in_pool`` (the python tool; not the calculator or lookup).

        >>> ToolEnv(["calculator", "python"]).runs_in_pool, ToolEnv(["calculator"]).runs_in_pool
        (True, False)
        """
        return any(getattr(t.fn, "runs_in_pool", False) is True for t in self.tools.values())

    def schemas(self) -> list[dict[str, Any]] | None:
        """The tools' function schemas for the prompt (``apply_chat_template(tools=...)``) under the json
        protocol; None under the text protocol (its prompts say how to call, as the data writes them)."""
        return [schema(t) for t in self.tools.values()] if self.protocol == "json" else None

    def reset(self, sample: Mapping[str, Any]) -> str | None:
        """A new episode; the tools need nothing from ``sample`` and add no first observation."""
        self.calls = self.errors = 0
        self.done = False
        return None

    def step(self, action_text: str) -> Step:
        """Answer the calls ``action_text`` holds, in order, or end the episode when it holds none."""
        if self.done:
            raise EpisodeOver("step after the episode ended; reset() starts a new one")
        protocol = PROTOCOLS[self.protocol]
        calls = protocol.read(action_text, self.tools)
        if not calls:
            self.done = True
            return self._step(None, tool=None, error=None)
        answers = []
        for call in calls:
            answers.append(self._answer(call))
            if self.done:  # refused past max_calls: the calls after it are not run
                break
        ran = [a.tool for a in answers if a.tool is not None]
        error = next((a.error for a in answers if a.error is not None), None)
        return self._step(protocol.render(answers, self.max_chars), tool=ran[-1] if ran else None, error=error)

    def _answer(self, call: Call | ToolError) -> Answer:
        """A call was attempted: refuse it past ``max_calls`` (the episode ends), else count it and answer it."""
        if self.calls >= self.max_calls:
            self.done = True
            return self._failed(f"no calls left: at most {self.max_calls} per answer", None)
        self.calls += 1
        if isinstance(call, ToolError):
            return self._failed(str(call) or "malformed call", None)
        output, error = run(self.tools[call.name], call.arguments)
        if error is not None:
            return self._failed(error, call.name)
        return Answer(call.name, output, None)

    def _failed(self, message: str, tool: str | None) -> Answer:
        self.errors += 1
        return Answer(tool, "", message)

    def _step(self, observation: str | None, *, tool: str | None, error: str | None) -> Step:
        info = {"tool": tool, "error": error, "calls": self.calls, "errors": self.errors}
        return Step(observation, None, self.done, info)


def shown_tools(make: Callable[..., Any], params: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The function schemas the environment ``make(**params)`` shows the model in its prompt: its ``schemas()``
    (a ToolEnv with the json protocol); None when it shows none. Only a class with a ``schemas`` method is built
    to ask (an environment of your own is never built for nothing).

    >>> shown_tools(ToolEnv, {"protocol": "json"})[0]["function"]["name"], shown_tools(ToolEnv, {})
    ('calculator', None)
    """
    if not callable(getattr(make, "schemas", None)):
        return None
    return make(**params).schemas()


def run(tool: Tool, arguments: Mapping[str, Any]) -> tuple[str, str | None]:
    """``(output, None)``, or ``("", message)`` when the tool refuses (:class:`ToolError`), raises anything else
    (named with its type: the model sees that the tool broke) or returns something that is not text."""
    try:
        output = tool.fn(**arguments)
    except ToolError as e:
        return "", str(e) or f"{tool.name} refused the call"
    except Exception as e:  # a broken tool costs this call, never the rollout
        lines = str(e).strip().splitlines()
        return "", f"{tool.name} failed: {type(e).__name__}" + (f": {clip(lines[0], 80)}" if lines else "")
    if not isinstance(output, str):
        return "", f"{tool.name} returned {type(output).__name__}, not text"
    return output, None


def _build(name: str, params: Mapping[str, Any]) -> Tool:
    try:
        tool = TOOLS.get(name)(**params)
    except ValueError as e:  # a value the factory refuses, named by the factory
        raise ValueError(f"tools: {name}: {e}") from None
    if not isinstance(tool, Tool) or tool.name != name:
        raise ValueError(f"tools: the factory registered as {name!r} built {tool!r}, not a Tool named {name!r}")
    return tool


def _tool_specs(tools: Any) -> list[tuple[str, dict[str, Any]]]:
    """``tools`` as ``(name, parameters)`` of distinct registered tools; a ``ValueError`` naming ``tools`` otherwise."""
    if isinstance(tools, str) or not isinstance(tools, Sequence):
        raise ValueError(f"tools: expected a list of tool names, got {type(tools).__name__} {tools!r}")
    if not tools:
        raise ValueError(f"tools: name at least one tool; registered: {', '.join(TOOLS)}")
    specs = [_tool_spec(item) for item in tools]
    names = [name for name, _ in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"tools: a tool is named twice in {names!r}")
    return specs


def _tool_spec(item: Any) -> tuple[str, dict[str, Any]]:
    """A name, or a mapping ``{"name": NAME, **parameters}``, as ``(name, parameters)``, the parameters checked
    against the factory's signature: one it does not take, or a required one missing, is a ``ValueError``."""
    name, params = item, {}
    if isinstance(item, Mapping):
        params = dict(item)
        if "name" not in params:
            raise ValueError(f"tools: a tool given with parameters needs its 'name', got {item!r}")
        name = params.pop("name")
    if not isinstance(name, str) or name not in TOOLS:
        raise ValueError(f"tools: unknown tool {name!r}; registered: {', '.join(TOOLS)}")
    _check_params(name, TOOLS.get(name), params)
    return name, params


def _check_params(name: str, factory: Callable[..., Tool], params: Mapping[str, Any]) -> None:
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature to read (a builtin): the call decides
        return
    takes = {k: p for k, p in signature.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if not any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values()):
        for key in params:
            if key not in takes:
                raise ValueError(f"tools: tool {name!r} has no parameter {key!r}; it takes: "
                                 f"{', '.join(takes) or 'none'}")
    for key, p in takes.items():
        if p.default is p.empty and key not in params:
            raise ValueError(f"tools: tool {name!r} needs the parameter {key!r}: "
                             f"{{name: {name}, {key}: ...}}")
