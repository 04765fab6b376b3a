r"""Tool calls in the chat template's own format: JSON inside ``<tool_call>`` tags, as Qwen2.5's, Hermes' and the
templates modelled on them write them (``ToolEnv(protocol="json")``)::

    the model writes           <tool_call>
                               {"name": "calculator", "arguments": {"expression": "347*829"}}
                               </tool_call>
    the environment answers    a tool message, rendered by the chat template (Qwen2.5: inside <tool_response>):
                               287663        or    error: division by zero

- The prompt shows the tools' function schemas through the chat template (``apply_chat_template(tools=...)``,
  ``rlft.envs.tools.schema``); the model ends its message after its calls and the answer is a message of its own.
- A turn may hold several calls: each ``<tool_call>...</tool_call>`` is read, in order (:func:`parse_calls`), and
  they are answered in that order in one message (:func:`render_answers`): one call's answer is its output, or
  ``error: MESSAGE``; several answers are one JSON object a line, ``{"name": NAME, "content": OUTPUT}`` or
  ``{"name": NAME, "error": MESSAGE}`` (``"name": null`` for a call that reached no tool).
- A call is a JSON object with ``name`` (a tool of the environment) and ``arguments``: an object, or a string
  holding one (the OpenAI form); without ``arguments`` it passes none. Any other key is an error (``parameters``
  is not read as ``arguments``: the model learns the one form).
- A ``<tool_call>`` without its ``</tool_call>`` is a malformed call (the complete calls before it are still
  read), and so is a ``</tool_call>`` without a ``<tool_call>``. Text with neither tag holds no call.
- Whatever is wrong with a call is a :class:`~rlft.envs.tools.ToolError` whose message the model reads; the
  arguments are checked as in the plain-text protocol (:func:`~rlft.envs.tools.check_arguments`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from rlft.envs.tools import Call, Tool, ToolError, check_arguments, cut, load_json, short

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FORM = '{"name": NAME, "arguments": {...}}'
_JSON_NAMES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


class Answer(NamedTuple):
    """The answer to one call: the tool that ran (None: the call reached none), its output, or the error."""

    tool: str | None
    output: str
    error: str | None


def split_calls(text: str) -> list[str | ToolError]:
    """The bodies of the calls in ``text``, in order and stripped, with a :class:`ToolError` in the place of
    broken tags; [] when ``text`` holds no call.

    >>> for found in split_calls('a <tool_call> {"name": "x"} </tool_call> b </tool_call> <tool_call>{}'):
    ...     print(repr(found))
    '{"name": "x"}'
    ToolError('</tool_call> without <tool_call>')
    ToolError('unclosed <tool_call>: end the call with </tool_call>')
    """
    out: list[str | ToolError] = []
    pos = 0
    while True:
        start, stray = text.find(OPEN, pos), text.find(CLOSE, pos)
        if stray >= 0 and (start < 0 or stray < start):
            out.append(ToolError(f"{CLOSE} without {OPEN}"))
            pos = stray + len(CLOSE)
            continue
        if start < 0:
            return out
        end = text.find(CLOSE, start)
        if end < 0:
            out.append(ToolError(f"unclosed {OPEN}: end the call with {CLOSE}"))
            return out
        out.append(text[start + len(OPEN):end].strip())
        pos = end + len(CLOSE)


def read_call(body: str, tools: Mapping[str, Tool]) -> Call:
    r"""The call the JSON ``body`` makes, its arguments checked against ``tools`` (name -> Tool); a
    :class:`ToolError` the model reads otherwise.

    >>> from rlft.envs.tools import TOOLS
    >>> kit = {"calculator": TOOLS.get("calculator")()}
    >>> read_call('{"name": "calculator", "arguments": {"expression": "2+3"}}', kit)
    Call(name='calculator', arguments={'expression': '2+3'})
    >>> read_call('{"name": "calculator", "arguments": "{\\"expression\\": \\"2\\"}"}', kit)
    Call(name='calculator', arguments={'expression': '2'})
    >>> read_call('{"name": "calculator", "arguments": {"expression": 5}}', kit)
    Traceback (most recent call last):
    rlft.envs.tools.ToolError: argument 'expression': expected string, got int
    """
    value = load_json(body, f"JSON in {OPEN}")
    if not isinstance(value, dict):
        raise ToolError(f"a call is a JSON object {FORM}, got {json_name(value)}")
    for key in value:
        if key not in ("name", "arguments"):
            raise ToolError(f"unexpected key {short(key)}: a call is {FORM}")
    name = value.get("name")
    if not isinstance(name, str):
        raise ToolError(f"no tool name: a call is {FORM}" if name is None else
                        f"name: expected a string, got {json_name(name)}")
    if name not in tools:
        raise ToolError(f"unknown tool {short(name)}; tools: {', '.join(sorted(tools)) or 'none'}")
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # the OpenAI form: the arguments object written as a string
        arguments = load_json(arguments, f"JSON arguments of {name}") if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise ToolError(f"arguments of {name}: expected a JSON object, got {json_name(arguments)}")
    check_arguments(tools[name], arguments)
    return Call(name, arguments)


def parse_calls(text: str, tools: Mapping[str, Tool]) -> list[Call | ToolError]:
    """Every call in ``text``, in order: a :class:`Call`, or the :class:`ToolError` the model reads for one that
    cannot be made; [] when ``text`` holds no call (the final answer).

    >>> from rlft.envs.tools import TOOLS
    >>> kit = {"calculator": TOOLS.get("calculator")()}
    >>> parse_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>'
    ...             '<tool_call>{"name": "calc"}</tool_call>', kit)
    [Call(name='calculator', arguments={'expression': '1'}), ToolError("unknown tool 'calc'; tools: calculator")]
    >>> parse_calls("The answer is 5.", kit)
    []
    """
    out: list[Call | ToolError] = []
    for body in split_calls(text):
        if isinstance(body, ToolError):
            out.append(body)
            continue
        try:
            out.append(read_call(body, tools))
        except ToolError as e:
            out.append(e)
    return out


def render_answers(answers: Sequence[Answer], max_chars: int) -> str:
    """The observation answering a turn's calls, each output or error cut at ``max_chars``: one answer's output
    (``error: MESSAGE`` for an error); several answers as one JSON object a line, in the order of the calls.

    >>> render_answers([Answer("calculator", "5", None)], 200)
    '5'
    >>> render_answers([Answer(None, "", "unknown tool 'calc'; tools: calculator")], 200)
    "error: unknown tool 'calc'; tools: calculator"
    >>> print(render_answers([Answer("calculator", "5", None), Answer("calculator", "", "division by zero")], 200))
    {"name": "calculator", "content": "5"}
    {"name": "calculator", "error": "division by zero"}
    """
    if len(answers) == 1:
        (a,) = answers
        return cut(a.output, max_chars) if a.error is None else "error: " + cut(a.error, max_chars)
    return "\n".join(json.dumps({"name": a.tool, **({"content": cut(a.output, max_chars)} if a.error is None
                                                   else {"error": cut(a.error, max_chars)})}, ensure_ascii=False)
                     for a in answers)


def json_name(value: Any) -> str:
    """The JSON type of a parsed ``value``, for a message.

    >>> json_name([1]), json_name(None), json_name(2.5)
    ('array', 'null', 'number')
    """
    return _JSON_NAMES.get(type(value), type(value).__name__)
