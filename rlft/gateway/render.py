r"""A conversation in OpenAI's messages as the text a model continues, and a sampled turn as OpenAI's reply.

Two ways a model writes tool calls (``Conversation.protocol``), chosen from its tokenizer:

- ``json``: the chat template shows tools itself (it renders ``apply_chat_template(tools=...)`` differently from
  without): Hermes/Qwen-style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in the assistant's
  message, each tool's answer a ``tool`` message the template renders (``rlft.envs.tool_json``'s format);
- ``text``: a template without tools (the embedded model's): rlft's plain-text protocol (``rlft.envs.tools``). The
  model writes ``<call>NAME: ARGUMENTS</call>`` and pauses there (a stop text); a ``tool`` message answering it
  continues the same assistant message as ``<result>OUTPUT</result>``, outside the template, and the model goes on
  writing that message. Assistant and tool messages in a row are one assistant message.

An assistant message the gateway itself returned is rendered as it was sampled (``own``: its text, special tokens
and all), never from its parsed content and calls: the template sees the model's own words, so a session continues
token for token (``rlft.gateway.session``). Any other assistant message (an agent that rewrote one, or wrote one
itself) is rendered from its fields.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlft.envs.tool_json import CLOSE as JSON_CLOSE, OPEN as JSON_OPEN, split_calls
from rlft.envs.tools import CLOSE, OPEN, ToolError, find_call, render_result

_PROBE = [{"name": "rlft_probe_tool", "description": "probe", "parameters": {"type": "object", "properties": {}}}]
_MARK = "\x00rlft-continue\x00"  # ends a final assistant message to find where its text stops in the rendering
Own = Callable[[Mapping[str, Any]], "tuple[str, bool] | None"]  # an assistant message -> (sampled text, paused)


def call_key(content: str, calls: Sequence[Mapping[str, Any]]) -> tuple:
    """What identifies an assistant message the gateway returned when a client sends it back: its text and its
    calls, arguments compared as JSON values (a client may re-serialise them)."""
    def value(arguments: str) -> str:
        try:
            return json.dumps(json.loads(arguments), sort_keys=True)
        except ValueError:
            return arguments
    return (content or "", tuple((c["name"], value(c["arguments"])) for c in calls))


class Conversation:
    """Renders requests and reads replies for one tokenizer (see the module's docstring)."""

    def __init__(self, tokenizer, max_result_chars: int = 4000):
        self.tok = tokenizer
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        self.max_result_chars = max_result_chars
        self.protocol = "json" if self.chat and self._shows_tools() else "text"

    def _shows_tools(self) -> bool:
        msgs = [{"role": "user", "content": "x"}]
        try:
            with_tools = self.tok.apply_chat_template(msgs, tools=[_schema(t) for t in _PROBE], tokenize=False,
                                                      add_generation_prompt=True)
        except Exception:  # noqa: BLE001  a template that fails on tools= does not show them
            return False
        return with_tools != self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)

    def stops(self, tools: Sequence[dict]) -> list[str]:
        """Text that pauses a turn: the end of a plain-text call, when the request offers tools."""
        return [CLOSE] if tools and self.protocol == "text" else []

    def text(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[dict], own: Own) -> str:
        """The text the model continues for ``messages`` (normalised, ``rlft.gateway.request``)."""
        msgs, open_end = (self._json if self.protocol == "json" else self._folded)(messages, tools, own)
        if not self.chat:
            return "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in msgs) + "Assistant:"
        extra = {"tools": [_schema(t) for t in tools]} if tools and self.protocol == "json" else {}
        if not open_end:
            return self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **extra)
        marked = msgs[:-1] + [{**msgs[-1], "content": msgs[-1]["content"] + _MARK}]
        rendered = self.tok.apply_chat_template(marked, tokenize=False, add_generation_prompt=False, **extra)
        return rendered[:rendered.rindex(_MARK)]

    def _folded(self, messages, tools, own: Own) -> tuple[list[dict], bool]:
        """The text protocol: an assistant's calls and the tools' answers folded into one assistant message."""
        out: list[dict] = []
        paused = False  # the last assistant message stops at a call, so what follows continues it
        for m in messages:
            if m["role"] == "assistant":
                mine = own(m)
                body, stopped = mine if mine else (m["content"] + "".join(
                    f"{OPEN}{c['name']}: {_argument_text(c, tools)}{CLOSE}" for c in m.get("tool_calls", [])),
                    bool(m.get("tool_calls")))
                if out and out[-1]["role"] == "assistant" and paused:
                    out[-1]["content"] += body
                else:
                    out.append({"role": "assistant", "content": body})
                paused = stopped
            elif m["role"] == "tool" and out and out[-1]["role"] == "assistant" and paused:
                out[-1]["content"] += render_result(m["content"], self.max_result_chars)
            else:
                out.append({"role": m["role"], "content": m["content"]})
                paused = False
        return out, bool(out) and out[-1]["role"] == "assistant"

    def _json(self, messages, tools, own: Own) -> tuple[list[dict], bool]:
        """The template's own tool format: the gateway's messages as sampled, others with their calls."""
        out = []
        for m in messages:
            mine = own(m) if m["role"] == "assistant" else None
            if mine:
                out.append({"role": "assistant", "content": mine[0]})
            elif m.get("tool_calls"):
                out.append({"role": "assistant", "content": m["content"], "tool_calls": [
                    {"type": "function", "function": {"name": c["name"], "arguments": _loaded(c["arguments"])}}
                    for c in m["tool_calls"]]})
            else:
                out.append({"role": m["role"], "content": m["content"]})
        return out, out[-1]["role"] == "assistant"

    def reply(self, text: str, tools: Sequence[dict], tool_choice: str = "auto") -> tuple[str, list[dict]]:
        """A sampled turn's ``text`` (special tokens dropped) as OpenAI's ``(content, tool_calls)``: the calls it
        makes to the request's ``tools``. A turn whose calls cannot be read (an unknown tool, broken tags or JSON)
        is returned as text with no calls: the client sees what the model wrote."""
        if not tools or tool_choice == "none":
            return text, []
        names = {t["name"]: t for t in tools}
        try:
            found = self._read_json(text, names) if self.protocol == "json" else self._read_text(text, names)
            if found is None:
                return text, []
            content, calls = found[0], [(name, json.dumps(args, allow_nan=False)) for name, args in found[1]]
        except (ToolError, ValueError, TypeError, RecursionError):  # allow_nan: NaN and Infinity are not JSON
            return text, []
        return content, [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                          "function": {"name": name, "arguments": arguments}} for name, arguments in calls]

    @staticmethod
    def _read_text(text: str, tools: Mapping[str, dict]):
        found = find_call(text)
        if found is None or not text.rstrip().endswith(CLOSE):
            return None
        name, argument_text = found
        if name not in tools:
            raise ToolError(f"unknown tool {name!r}")
        return text[:text.rfind(OPEN)], [(name, _bound(tools[name], argument_text))]

    @staticmethod
    def _read_json(text: str, tools: Mapping[str, dict]):
        bodies = split_calls(text)
        if not bodies:
            return None
        calls = []
        for body in bodies:
            if isinstance(body, ToolError):
                raise body
            call = json.loads(body)
            if not isinstance(call, dict) or call.get("name") not in tools or set(call) - {"name", "arguments"}:
                raise ValueError("not a call to one of the request's tools")
            args = _loaded(call.get("arguments", {}))
            if not isinstance(args, dict):
                raise ValueError("arguments must be an object")
            calls.append((call["name"], args))
        after = text[text.rfind(JSON_CLOSE) + len(JSON_CLOSE):]
        return (text[:text.find(JSON_OPEN)].rstrip() + after.strip()), calls


def _schema(tool: Mapping[str, Any]) -> dict:
    return {"type": "function", "function": dict(tool)}


def _loaded(arguments):
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def _single_string(tool: Mapping[str, Any]) -> str | None:
    """The name of the tool's only required parameter when it is a string (the calculator's ``expression``)."""
    params = tool.get("parameters") or {}
    required, props = params.get("required") or [], params.get("properties") or {}
    if len(required) == 1 and (props.get(required[0]) or {}).get("type", "string") == "string":
        return required[0]
    if not required and len(props) == 1:
        (name, spec), = props.items()
        return name if (spec or {}).get("type", "string") == "string" else None
    return None


def _bound(tool: Mapping[str, Any], argument_text: str) -> dict:
    """The arguments of a plain-text call: a JSON object by name, else the single string parameter's value."""
    if argument_text.startswith("{"):
        args = json.loads(argument_text)
        if not isinstance(args, dict):
            raise ValueError("arguments must be an object")
        return args
    if not argument_text:
        return {}
    name = _single_string(tool)
    if name is None:
        raise ToolError(f"tool {tool['name']!r} takes JSON arguments")
    return {name: argument_text}


def _argument_text(call: Mapping[str, Any], tools: Sequence[dict]) -> str:
    """A call's arguments as the plain-text protocol writes them (the inverse of :func:`_bound`): the single string
    parameter's value bare when it reads back as itself, else JSON with ``<`` escaped (no tag inside a value)."""
    args = _loaded(call["arguments"])
    tool = next((t for t in tools if t["name"] == call["name"]), None)
    name = _single_string(tool) if tool else None
    if name is not None and isinstance(args, dict) and list(args) == [name] and isinstance(args[name], str) and \
            args[name] == args[name].strip() and args[name][:1] not in ("", "{") and "<" not in args[name]:
        return args[name]
    return json.dumps(args).replace("<", "\\u003c")
