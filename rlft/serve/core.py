"""The OpenAI Chat Completions API over a loaded policy, without HTTP: ``Policy.handle(body)``.

A request is checked against OpenAI's fields and rlft's bounds (``Limits``); a bad one is a ``RequestError`` naming
the field, which the shell answers with its status and OpenAI's error JSON. The messages are rendered with the
tokenizer's chat template (:func:`rlft.models.tokens.chat_prompt_ids`, as ``rlft chat`` renders them) and sampled
by rlft's rollout sampler (:func:`rlft.rollout.hf.generate`, the one training uses), so each choice's log-probs are
those the trainer would record. Not supported yet, each a 400 saying so: tools and tool calls, streaming, logit
bias, penalties, ``top_logprobs``, structured output.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field

import torch

from rlft.models.tokens import chat_prompt_ids
from rlft.rollout.hf import generate

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# fields a client may send that change what is sampled but rlft serve does not honour: each refused by name
UNSUPPORTED = {"tools": "tools are not supported by rlft serve yet",
               "tool_choice": "tools are not supported by rlft serve yet",
               "functions": "tools are not supported by rlft serve yet",
               "function_call": "tools are not supported by rlft serve yet",
               "logit_bias": "logit_bias is not supported by rlft serve yet",
               "audio": "audio is not supported by rlft serve"}


@dataclass(frozen=True)
class Limits:
    max_tokens: int = 512  # sampled tokens per choice (--max-tokens); also the default when a request names none
    max_n: int = 16  # choices per request
    max_body_bytes: int = 1_000_000  # a request's JSON body


class RequestError(ValueError):
    """A request rlft serve refuses: ``status`` and OpenAI's error JSON (``body``), naming the field (``param``)."""

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


@dataclass
class Record:
    """What one request sampled, for a caller that trains on it: the prompt ids as rendered, and per choice the
    sampled ids (the end-of-turn token included, as the trainer sees it) and each one's log-prob under
    softmax(logits / temperature)."""
    prompt_ids: list[int]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    finish_reasons: list[str]


def _number(req: dict, key: str, default, lo: float, hi: float, *, integer: bool = False, lo_open: bool = False):
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


def _messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise RequestError("messages must be a non-empty list of {role, content}", "messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(f"{where}.role must be one of {', '.join(ROLES)} (tool messages are not supported "
                               f"by rlft serve yet), got {m.get('role') if isinstance(m, dict) else m!r}", where)
        content = m.get("content")
        if isinstance(content, list):  # content parts: text ones only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError(f"{where}.content: only text parts are supported", f"{where}.content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestError(f"{where}.content must be a string, got {type(content).__name__}", f"{where}.content")
        if m.get("tool_calls"):
            raise RequestError("tools are not supported by rlft serve yet", f"{where}.tool_calls")
        out.append({"role": ROLES[m["role"]], "content": content})
    return out


def parse(req, limits: Limits, name: str) -> Params:
    """The sampling parameters of a request body (a dict), or a ``RequestError`` naming what is wrong."""
    if not isinstance(req, dict):
        raise RequestError("the request body must be a JSON object")
    for key, why in UNSUPPORTED.items():
        if req.get(key) not in (None, [], {}):
            raise RequestError(why, key)
    if req.get("stream"):
        raise RequestError("stream is not supported by rlft serve yet", "stream")
    for key in ("frequency_penalty", "presence_penalty"):
        if req.get(key) not in (None, 0, 0.0):
            raise RequestError(f"{key} is not supported by rlft serve yet (only 0)", key)
    if req.get("top_logprobs") not in (None, 0):
        raise RequestError("top_logprobs is not supported by rlft serve yet (only 0)", "top_logprobs")
    fmt = req.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise RequestError("response_format is not supported by rlft serve yet (only text)", "response_format")
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
    return Params(messages=_messages(req.get("messages")),
                  n=_number(req, "n", 1, 1, limits.max_n, integer=True),
                  temperature=float(_number(req, "temperature", 1.0, 0, 2)),
                  top_p=float(_number(req, "top_p", 1.0, 0, 1, lo_open=True)),
                  max_tokens=_number(req, key, limits.max_tokens, 1, limits.max_tokens, integer=True),
                  stop=stop, seed=_number(req, "seed", None, -2**63, 2**64 - 1, integer=True),
                  logprobs=bool(req.get("logprobs")))


@dataclass
class Policy:
    """A loaded policy answering Chat Completions requests; ``name`` is the ``model`` clients name."""
    model: object
    tokenizer: object
    name: str
    limits: Limits = field(default_factory=Limits)

    def handle(self, body: bytes) -> tuple[dict, Record]:
        """The response to a request's raw JSON body and the record of what was sampled; a ``RequestError`` for
        a body over ``limits.max_body_bytes``, one that is not JSON, or a request ``parse`` refuses."""
        if len(body) > self.limits.max_body_bytes:
            raise RequestError(f"the request body is {len(body)} bytes, over the limit of "
                               f"{self.limits.max_body_bytes}", status=413)
        try:
            req = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise RequestError(f"the request body is not JSON: {e}") from None
        return self.complete(req)

    @torch.no_grad()
    def complete(self, req: dict) -> tuple[dict, Record]:
        """The response to a request (a dict) in OpenAI's ``chat.completion`` shape, and its ``Record``."""
        p = parse(req, self.limits, self.name)
        prompt = chat_prompt_ids(self.tokenizer, p.messages)
        greedy = p.temperature == 0
        device = next(self.model.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            if p.seed is not None:
                torch.manual_seed(p.seed % 2**63)
            batch = generate(self.model, self.tokenizer, [prompt], group_size=p.n, max_new_tokens=p.max_tokens,
                             temperature=1.0 if greedy else p.temperature, top_p=p.top_p, greedy=greedy)
        record = Record(prompt_ids=list(prompt), completion_ids=[], logprobs=[], finish_reasons=[])
        choices = []
        for i in range(p.n):
            length = int(batch.response_mask[i].sum())
            ids = batch.response_ids[i, :length].tolist()
            lps = batch.rollout_logp[i, :length].tolist()
            text, ids, stopped = self._cut(ids, p.stop)
            lps = lps[:len(ids)]
            reason = "stop" if stopped or not bool(batch.truncated[i]) else "length"
            record.completion_ids.append(ids)
            record.logprobs.append(lps)
            record.finish_reasons.append(reason)
            choices.append({"index": i, "message": {"role": "assistant", "content": text},
                            "finish_reason": reason, "logprobs": self._logprobs(ids, lps) if p.logprobs else None})
        completion = sum(len(ids) for ids in record.completion_ids)
        response = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                    "model": self.name, "choices": choices,
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion,
                              "total_tokens": len(prompt) + completion}}
        return response, record

    def _cut(self, ids: list[int], stop: list[str]) -> tuple[str, list[int], bool]:
        """(the reply's text, the ids kept, whether a stop string ended it): with stop strings, the ids end at the
        first token whose text completes one, and the text ends before it (as OpenAI's ``stop``)."""
        decode = self.tokenizer.decode
        text = decode(ids, skip_special_tokens=True)
        found = [text.find(s) for s in stop if s in text]
        if not found:
            return text, ids, False
        end = min(found)
        k = next(k for k in range(1, len(ids) + 1)
                 if any(s in decode(ids[:k], skip_special_tokens=True) for s in stop))
        return text[:end], ids[:k], True

    def _logprobs(self, ids: list[int], lps: list[float]) -> dict:
        """OpenAI's ``logprobs.content`` for the sampled tokens that are text (an end-of-turn token is not)."""
        special = set(self.tokenizer.all_special_ids)
        out = []
        for t, lp in zip(ids, lps):
            if t in special:
                continue
            token = self.tokenizer.decode([t])
            out.append({"token": token, "logprob": lp, "bytes": list(token.encode("utf-8")), "top_logprobs": []})
        return {"content": out}
