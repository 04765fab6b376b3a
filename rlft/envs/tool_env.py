"""``ToolEnv`` (ENVS ``"tools"``): the model calls tools in the plain-text protocol of :mod:`rlft.envs.tools`.

Each turn that holds a call is answered with the tool's ``<result>`` or an ``<error>`` and the episode goes on;
the first turn without a call is the final answer: the episode ends with reward None, so the run's reward
functions score the final text. A malformed call counts as a call (a model that only writes broken calls still
ends), and once ``max_calls`` calls were made the next one is refused and ends the episode: an episode has at
most ``max_calls + 1`` turns.

``info`` of every step: ``tool`` (the tool that ran, else None), ``error`` (the message the model read, else
None), ``calls`` and ``errors`` (counts so far in this episode).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlft.envs.base import ENVS, EpisodeOver, Step, check_int
from rlft.envs.tools import MAX_CHARS, TOOLS, Call, Tool, ToolError, clip, parse_call, render_error, render_result


@ENVS.register("tools")
class ToolEnv:
    """Tools for one trajectory. ``tools``: names in ``TOOLS``, or mappings ``{"name": NAME, **parameters}``
    for factories that take parameters (``{"name": "lookup", "path": "docs.jsonl", "k": 3}``), checked against
    the factory's signature; ``max_calls``: calls allowed per episode; ``max_chars``: a result or error longer
    than this is cut (marked ``...[cut]``)."""

    def __init__(self, tools: Sequence[str | Mapping[str, Any]] = ("calculator",), max_calls: int = 4,
                 max_chars: int = MAX_CHARS):
        self.tools: dict[str, Tool] = {name: _build(name, params) for name, params in _tool_specs(tools)}
        self.max_calls = check_int("max_calls", max_calls, low=1)
        self.max_chars = check_int("max_chars", max_chars, low=1)
        self.calls = self.errors = 0
        self.done = False

    def reset(self, sample: Mapping[str, Any]) -> str | None:
        """A new episode; the tools need nothing from ``sample`` and add no first observation."""
        self.calls = self.errors = 0
        self.done = False
        return None

    def step(self, action_text: str) -> Step:
        """Run the call ``action_text`` ends on, or end the episode when it holds none."""
        if self.done:
            raise EpisodeOver("step after the episode ended; reset() starts a new one")
        try:
            call = parse_call(action_text, self.tools)
        except ToolError as e:
            return self._called(None, error=str(e) or "malformed call")
        if call is None:
            self.done = True
            return self._step(None, tool=None, error=None)
        return self._called(call)

    def _called(self, call: Call | None, error: str | None = None) -> Step:
        """A call was attempted: refuse it past ``max_calls``, else count it and answer it."""
        if self.calls >= self.max_calls:
            self.done = True
            return self._failed(f"no calls left: at most {self.max_calls} per answer", None)
        self.calls += 1
        if error is not None:
            return self._failed(error, None)
        output, error = run(self.tools[call.name], call.arguments)
        if error is not None:
            return self._failed(error, call.name)
        return self._step(render_result(output, self.max_chars), tool=call.name, error=None)

    def _failed(self, message: str, tool: str | None) -> Step:
        self.errors += 1
        return self._step(render_error(message, self.max_chars), tool=tool, error=message)

    def _step(self, observation: str | None, *, tool: str | None, error: str | None) -> Step:
        info = {"tool": tool, "error": error, "calls": self.calls, "errors": self.errors}
        return Step(observation, None, self.done, info)


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
