"""Sessions: the model calls of one episode, assembled into training sequences without ever re-tokenising.

A session holds one or more *chains*; a chain is one training sequence: a prompt (token ids as rendered) and a
response in which the policy's sampled tokens (with their log-probs) and the tokens the conversation added between
calls (tool answers, the agent's next message, the template's markup: ``env``, attended to and never trained on)
follow in the order they came.

Each call's request is rendered to text (``rlft.gateway.render``). When that text starts with the text of the
session's current chain (its prompt and every token since, the sampled ones decoded as they were, special tokens
included), the call continues the chain: only the new tail is tokenised, once, and appended. Otherwise (the agent
rewrote or dropped history, or the template renders earlier turns differently now) the call starts a new chain
from its own rendering: a *prefix break*, counted, never papered over by re-tokenising the old chain into the new.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlft.gateway.render import call_key


@dataclass
class Chain:
    """One training sequence of a session."""

    prompt: list[int]
    text: str  # the rendered text of prompt + response so far (sampled tokens decoded with special tokens)
    ids: list[int] = field(default_factory=list)  # the response: sampled and added tokens, in order
    logp: list[float] = field(default_factory=list)  # the sampler's log-prob of each sampled token, 0.0 elsewhere
    env: list[int] = field(default_factory=list)  # 1 where the conversation added the token, 0 where it was sampled
    turns: int = 0  # calls answered on this chain
    segments: list[dict] = field(default_factory=list)  # {"who": "policy" | "env", "text", "tokens"} in order

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.ids)


@dataclass
class Session:
    """One episode's calls (see the module's docstring). ``deadline``: ``time.monotonic()`` after which its calls
    are refused and its episode is lost."""

    sid: str
    deadline: float
    opened: float = field(default_factory=time.monotonic)
    chains: list[Chain] = field(default_factory=list)
    own: dict[tuple, tuple[str, bool]] = field(default_factory=dict)  # call_key -> (sampled text, paused)
    requests: int = 0
    prefix_breaks: int = 0
    truncated: bool = False  # a call was refused at a limit (turns, tokens)
    error: str | None = None  # why the episode is lost (a refused request, the agent's failure), else None
    ended: bool = False  # the agent returned (or failed): no more calls
    reward: float | None = None
    info: dict = field(default_factory=dict)
    latency: list[float] = field(default_factory=list)  # seconds from a request's arrival to its answer
    tools: Counter = field(default_factory=Counter)  # calls the policy made, per tool name

    def fail(self, why: str) -> None:
        """The episode is lost (the first reason is kept)."""
        if self.error is None:
            self.error = why

    @property
    def live(self) -> bool:
        return not self.ended and self.error is None and time.monotonic() < self.deadline

    def own_text(self, message: dict) -> tuple[str, bool] | None:
        """The sampled text of an assistant message this session returned (and whether it paused at a call)."""
        return self.own.get(call_key(message["content"], message.get("tool_calls", [])))

    def context(self, text: str, encode: Callable[[str], list[int]]) -> Chain:
        """The chain a call rendered as ``text`` continues (its new tail appended), or a new chain from ``text``."""
        chain = self.chains[-1] if self.chains else None
        if chain is not None and text.startswith(chain.text):
            tail = text[len(chain.text):]
            ids = encode(tail) if tail else []
            chain.ids += ids
            chain.logp += [0.0] * len(ids)
            chain.env += [1] * len(ids)
            chain.text = text
            if ids:
                chain.segments.append({"who": "env", "text": tail, "tokens": len(ids)})
            return chain
        if chain is not None:
            self.prefix_breaks += 1
        chain = Chain(prompt=encode(text), text=text)
        self.chains.append(chain)
        return chain

    def sampled(self, chain: Chain, ids: list[int], logp: list[float], raw: str, shown: str, reply: tuple,
                message: str, paused: bool) -> None:
        """Append a sampled turn: its ``ids`` and ``logp``, ``raw`` its text with special tokens (what the chain's
        text gains), ``shown`` without them; ``reply`` the call_key of what the client was answered, ``message``
        the text that stands for it when the client sends it back (``raw`` without the end-of-turn markup the
        template writes itself), ``paused``: the turn stopped at a call."""
        chain.ids += ids
        chain.logp += logp
        chain.env += [0] * len(ids)
        chain.text += raw
        chain.turns += 1
        chain.segments.append({"who": "policy", "text": shown, "tokens": len(ids)})
        self.own[reply] = (message, paused)

    def record(self) -> dict[str, Any]:
        """What the episode's samples and reports keep of the session (plain data)."""
        return {"requests": self.requests, "chains": len(self.chains), "prefix_breaks": self.prefix_breaks,
                "truncated": self.truncated, "error": self.error, "reward": self.reward, "info": dict(self.info)}
