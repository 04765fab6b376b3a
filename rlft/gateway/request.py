"""A Chat Completions request, checked: OpenAI's fields, rlft's bounds, and a ``RequestError`` naming what is wrong.

Shared by the training gateway (``rlft.gateway.server``) and ``rlft serve``. Messages come out normalised: each a
dict with ``role`` (``system`` for OpenAI's ``developer`` too), ``content`` (a string: text parts joined), and for
an assistant's calls ``tool_calls`` (``[{"id", "name", "arguments"}]``, arguments as the JSON text the client sent),
for a tool's answer ``tool_call_id``. Fields that change what is sampled but that rlft does not honour are refused
by name (a 400), never ignored; fields that change nothing rlft samples (``user``, ``metadata``, ``store``,
``parallel_tool_calls``) are accepted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
UNSUPPORTED = {"functions": "the legacy functions field is not supported: send tools",
               "function_call": "the legacy function_call field is not supported: send tool_choice",
               "logit_bias": "logit_bias is not supported",
               "audio": "audio is not supported",
               "prediction": "predicted outputs are not supported"}


@dataclass(frozen=True)
class Limits:
    max_tokens: int = 512  # sampled tokens per choice; also the default when a request names none
    max_n: int = 16  # choices per request
    max_body_bytes: int = 1_000_000  # a request's JSON body


class RequestError(ValueError):
    """A refused request: ``status`` and OpenAI's error JSON (``body``), naming the field (``param``)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    @property
    def body(self) -> dict:
        return {"error": {"message": str(self), "type": "invalid_request_error", "param": self.param,
                          "code": self.code}}


@dataclass
class Params:
    messages: list[dict]
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    tools: list[dict] = field(default_factory=list)  # function schemas: {"name", "description", "parameters"}
    tool_choice: str = "auto"  # auto | none


def body_json(body: bytes, limits: Limits):
    """The request's raw ``body`` as JSON; a ``RequestError`` when it is over the bound (413) or not JSON."""
    if len(body) > limits.max_body_bytes:
        raise RequestError(f"the request body is {len(body)} bytes, over the limit of {limits.max_body_bytes}",
                           status=413)
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"the request body is not JSON: {e}") from None


def number(req: dict, key: str, default, lo: float, hi: float, *, integer: bool = False, lo_open: bool = False):
    """``req[key]`` checked to be a number (an integer) in ``[lo, hi]`` (``(lo, hi]``), else ``default``."""
    value = req.get(key)
    if value is None:
        return default
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or \
            (not integer and not math.isfinite(value)):
        raise RequestError(f"{key} must be {kind}, got {value!r}", key)
    if value < lo or value > hi or (lo_open and value == lo):
        raise RequestError(f"{key} must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {value!r}", key)
    return value


def _text(content, where: str, *, empty_ok: bool) -> str:
    if content is None and empty_ok:
        return ""
    if isinstance(content, list):  # content parts: text ones only
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise RequestError(f"{where}.content: only text parts are supported", f"{where}.content")
        return "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise RequestError(f"{where}.content must be a string, got {type(content).__name__}", f"{where}.content")
    return content


def _calls(value, where: str) -> list[dict]:
    if not isinstance(value, list):
        raise RequestError(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    out = []
    for j, c in enumerate(value):
        at = f"{where}.tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
            raise RequestError(f"{at} must be {{id, type: function, function: {{name, arguments}}}} with "
                               "arguments a JSON string", at)
        out.append({"id": str(c.get("id") or ""), "name": fn["name"], "arguments": fn["arguments"]})
    return out


def messages_of(value) -> list[dict]:
    """The request's ``messages``, normalised (see the module's docstring); a ``RequestError`` naming the one
    that is wrong."""
    if not isinstance(value, list) or not value:
        raise RequestError("messages must be a non-empty list of {role, content}", "messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in ROLES:
            raise RequestError(f"{where}.role must be one of {', '.join(ROLES)}, got "
                               f"{m.get('role') if isinstance(m, dict) else m!r}", where)
        role = ROLES[m["role"]]
        calls = _calls(m["tool_calls"], where) if role == "assistant" and m.get("tool_calls") else []
        msg = {"role": role, "content": _text(m.get("content"), where, empty_ok=bool(calls))}
        if calls:
            msg["tool_calls"] = calls
        elif m.get("tool_calls"):
            raise RequestError(f"{where}.tool_calls: only an assistant message makes calls", f"{where}.tool_calls")
        if role == "tool":
            msg["tool_call_id"] = str(m.get("tool_call_id") or "")
        out.append(msg)
    return out


def tools_of(value) -> list[dict]:
    """The request's ``tools`` as function schemas ``{"name", "description", "parameters"}``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError("tools must be a list of {type: function, function: {...}}", "tools")
    out = []
    for i, t in enumerate(value):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(f"tools[{i}] must be {{type: function, function: {{name, description, parameters}}}}",
                               f"tools[{i}]")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise RequestError(f"tools[{i}].function.parameters must be a JSON schema object",
                               f"tools[{i}].function.parameters")
        out.append({"name": fn["name"], "description": str(fn.get("description") or ""), "parameters": params})
    return out


def _tool_choice(value) -> str:
    if value in (None, "auto", "none"):
        return value or "auto"
    raise RequestError(f"tool_choice {value!r} is not supported: rlft samples the model freely and cannot force a "
                       "call; use auto or none", "tool_choice")


def parse(req, limits: Limits, name: str) -> Params:
    """The sampling parameters of a request body (a dict), or a ``RequestError`` naming what is wrong."""
    if not isinstance(req, dict):
        raise RequestError("the request body must be a JSON object")
    for key, why in UNSUPPORTED.items():
        if req.get(key) not in (None, [], {}):
            raise RequestError(why, key)
    if req.get("stream"):
        raise RequestError("stream is not supported: send stream=false", "stream")
    for key in ("frequency_penalty", "presence_penalty"):
        if req.get(key) not in (None, 0, 0.0):
            raise RequestError(f"{key} is not supported (only 0)", key)
    if req.get("top_logprobs") not in (None, 0):
        raise RequestError("top_logprobs is not supported (only 0)", "top_logprobs")
    fmt = req.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise RequestError("response_format is not supported (only text)", "response_format")
    if req.get("model") != name:
        raise RequestError(f"model must be {name!r} (GET /v1/models), got {req.get('model')!r}", "model",
                           status=404, code="model_not_found")
    key = "max_completion_tokens" if req.get("max_completion_tokens") is not None else "max_tokens"
    stop = req.get("stop")
    stop = [stop] if isinstance(stop, str) else [] if stop is None else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("stop must be a non-empty string or a list of at most 4 of them", "stop")
    if req.get("logprobs") not in (None, True, False):
        raise RequestError(f"logprobs must be true or false, got {req.get('logprobs')!r}", "logprobs")
    return Params(messages=messages_of(req.get("messages")),
                  n=number(req, "n", 1, 1, limits.max_n, integer=True),
                  temperature=float(number(req, "temperature", 1.0, 0, 2)),
                  top_p=float(number(req, "top_p", 1.0, 0, 1, lo_open=True)),
                  max_tokens=number(req, key, limits.max_tokens, 1, limits.max_tokens, integer=True),
                  stop=stop, seed=number(req, "seed", None, -2**63, 2**64 - 1, integer=True),
                  logprobs=bool(req.get("logprobs")), tools=tools_of(req.get("tools")),
                  tool_choice=_tool_choice(req.get("tool_choice")))
