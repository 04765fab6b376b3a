"""The OpenAI Chat Completions API over a loaded policy, without HTTP: ``Policy.handle(body)``.

A request is checked against OpenAI's fields and rlft's bounds (``Limits``); a bad one is a ``RequestError`` naming
the field, which the shell answers with its status and OpenAI's error JSON. The messages are rendered with the
tokenizer's chat template (``rlft.gateway.render.Conversation``) and sampled
by rlft's rollout sampler (:func:`rlft.rollout.hf.generate`, the one training uses), so each choice's log-probs are
those the trainer would record. Requests are read and replies written as the training gateway's are
(``rlft.gateway.request``, ``rlft.gateway.render``): tools in the model's own format (its chat template's
``<tool_call>`` JSON, or rlft's plain-text protocol for a template without tools), answered as OpenAI
``tool_calls``. Not supported, each a 400 saying so: streaming, logit bias, penalties, ``top_logprobs``,
structured output.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import torch

from rlft.gateway.render import Conversation
from rlft.gateway.request import Limits, RequestError, body_json, parse  # noqa: F401  (RequestError: the shell's)
from rlft.rollout.hf import generate


@dataclass
class Record:
    """What one request sampled, for a caller that trains on it: the prompt ids as rendered, and per choice the
    sampled ids (the end-of-turn token included, as the trainer sees it) and each one's log-prob under
    softmax(logits / temperature)."""
    prompt_ids: list[int]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    finish_reasons: list[str]


@dataclass
class Policy:
    """A loaded policy answering Chat Completions requests; ``name`` is the ``model`` clients name."""
    model: object
    tokenizer: object
    name: str
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self):
        self.conv = Conversation(self.tokenizer)

    def handle(self, body: bytes) -> tuple[dict, Record]:
        """The response to a request's raw JSON body and the record of what was sampled; a ``RequestError`` for
        a body over ``limits.max_body_bytes``, one that is not JSON, or a request ``parse`` refuses."""
        return self.complete(body_json(body, self.limits))

    @torch.no_grad()
    def complete(self, req: dict) -> tuple[dict, Record]:
        """The response to a request (a dict) in OpenAI's ``chat.completion`` shape, and its ``Record``."""
        p = parse(req, self.limits, self.name)
        try:
            text = self.conv.text(p.messages, p.tools, lambda m: None)
        except Exception as e:  # noqa: BLE001  the template refuses these messages (an order it cannot render)
            raise RequestError(f"the chat template cannot render these messages: {type(e).__name__}: {e}",
                               "messages") from None
        prompt = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        greedy = p.temperature == 0
        device = next(self.model.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            if p.seed is not None:
                torch.manual_seed(p.seed % 2**63)
            batch = generate(self.model, self.tokenizer, [prompt], group_size=p.n, max_new_tokens=p.max_tokens,
                             temperature=1.0 if greedy else p.temperature, top_p=p.top_p, greedy=greedy)
        record = Record(prompt_ids=list(prompt), completion_ids=[], logprobs=[], finish_reasons=[])
        choices, pause = [], self.conv.stops(p.tools)
        for i in range(p.n):
            length = int(batch.response_mask[i].sum())
            ids = batch.response_ids[i, :length].tolist()
            lps = batch.rollout_logp[i, :length].tolist()
            text, ids, stopped = self._cut(ids, p.stop + pause)
            rest = self.tokenizer.decode(ids, skip_special_tokens=True)[len(text):] if stopped else ""
            text += next((x for x in pause if rest.startswith(x)), "")  # a call's end stays in the text it ends
            content, calls = self.conv.reply(text, p.tools, p.tool_choice)
            lps = lps[:len(ids)]
            reason = "tool_calls" if calls else "stop" if stopped or not bool(batch.truncated[i]) else "length"
            record.completion_ids.append(ids)
            record.logprobs.append(lps)
            record.finish_reasons.append(reason)
            message = {"role": "assistant", "content": content if content or not calls else None}
            if calls:
                message["tool_calls"] = calls
            choices.append({"index": i, "message": message, "finish_reason": reason,
                            "logprobs": self._logprobs(ids, lps) if p.logprobs else None})
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
