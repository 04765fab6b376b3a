"""The gateway: an OpenAI-compatible HTTP server on 127.0.0.1 whose calls the trainer answers with the policy.

Each episode gets a session and its own base URL, ``http://127.0.0.1:PORT/s/SESSION/v1`` (``Gateway.open``), and
every request must carry the run's key (``Authorization: Bearer KEY``). The HTTP side (uvicorn, in a thread of the
trainer's process) only checks and queues requests; the trainer's own thread takes them in batches
(``Gateway.take``) and answers them (``Gateway.answer``): it renders each request (``rlft.gateway.render``),
extends or starts the session's chain (``rlft.gateway.session``), samples every request of the batch in one call of
the rollout sampler, the requests of identical contexts sharing their prefill, and replies in OpenAI's shape.

Routes: ``POST /s/SESSION/v1/chat/completions``, ``GET /s/SESSION/v1/models``, and ``POST /s/SESSION/end`` (the
episode's outcome, posted by the worker that ran the agent: ``{"reward", "info"}`` or ``{"error"}``).

A request that is refused (a wrong key, a body over the bound, a malformed request, a session past its deadline)
is answered with OpenAI's error JSON and costs its episode (``Session.error``), counted in ``gateway/errors``; the
other episodes go on. A call past the episode's turns (``max_turns``) or tokens is refused too, and the episode ends
there truncated (``Session.truncated``), as a trajectory cut by a limit does, whatever its agent then does.

What a request asks of sampling is honoured where it is the client's to decide (``stop``, ``tools``,
``tool_choice``, ``logprobs``, and ``max_tokens`` up to the run's per-turn budget, ``max_new_tokens``);
``temperature``, ``top_p`` and ``seed`` are the run's (the loss's log-probs are at the run's temperature); ``n``
above 1 is refused (a prompt's G episodes are rlft's group).
``stream: true`` is answered as server-sent events: the whole turn in one chunk, as it is sampled at once.
"""

import asyncio  # no `from __future__ import annotations`: FastAPI reads the routes' annotations (Request) at runtime
import hmac
import json
import math
import queue
import secrets
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from rlft.config.extras import require
from rlft.envs.agent import Endpoint
from rlft.gateway.render import Conversation, call_key
from rlft.gateway.request import Limits, Params, RequestError, body_json, parse
from rlft.gateway.session import Chain, Session


START_WINDOW_S = 5.0  # how long a batch waits for an episode's first call after its session opened


@dataclass
class Pending:
    """A request waiting for the trainer: its session, its parameters, and where its answer goes."""

    session: Session
    params: Params
    arrived: float
    future: Any  # asyncio.Future of the HTTP side
    loop: Any


@dataclass(frozen=True)
class Turn:
    """Where a request's sampled turn is cut and what the client is answered."""

    ids: list[int]
    logp: list[float]
    ended: bool  # an end-of-turn token ends it
    stopped: bool  # a stop text ends it (the protocol's call end, or the request's stop)
    paused: bool  # the protocol's call end ends it (the model goes on writing this message after the answer)


class Gateway:
    """See the module's docstring. ``max_turns`` and ``max_tokens`` bound one episode (its calls; a chain's
    prompt and response); ``max_new_tokens`` one call."""

    def __init__(self, tokenizer, *, name: str = "policy", limits: Limits = Limits(), max_turns: int = 8,
                 max_tokens: int = 1 << 30, max_new_tokens: int = 512, max_result_chars: int = 4000,
                 stop_ids: list[int] | None = None):
        self.tok, self.name, self.limits = tokenizer, name, limits
        self.max_turns, self.max_tokens, self.max_new_tokens = max_turns, max_tokens, max_new_tokens
        self.conv = Conversation(tokenizer, max_result_chars)
        self.stop_ids = list(stop_ids or [])
        self.key = secrets.token_urlsafe(24)
        self.sessions: dict[str, Session] = {}
        self.inbox: "queue.Queue[Pending]" = queue.Queue()
        self.port = 0
        self._server = self._thread = None
        self.requests = self.tokens = 0

    # -- the HTTP side ----------------------------------------------------------------------------------------
    def start(self) -> "Gateway":
        """Serve on 127.0.0.1, a free port; returns once the port listens."""
        require("fastapi", "the agent gateway")
        require("uvicorn", "the agent gateway")
        import uvicorn

        config = uvicorn.Config(self._app(), host="127.0.0.1", port=0, log_level="warning", access_log=False,
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="rlft-gateway", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the agent gateway did not start listening on 127.0.0.1")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        """Stop serving: the port is closed when this returns."""
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = self._thread = None

    def __enter__(self) -> "Gateway":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _app(self):
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse

        app = FastAPI(title="rlft gateway", docs_url=None, redoc_url=None, openapi_url=None)

        def refused(request: Request, sid: str) -> JSONResponse | None:
            session = self.sessions.get(sid)
            if session is None:
                return _error(RequestError(f"no session {sid[:40]!r}", status=404, code="not_found"))
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.key}".encode()):
                session.fail("a request without the run's API key")
                return _error(RequestError("Incorrect API key provided", status=401, code="invalid_api_key"))
            return None

        async def body(request: Request, session: Session) -> bytes:
            data, limit = bytearray(), self.limits.max_body_bytes
            async for chunk in request.stream():  # read no further than the bound
                data += chunk
                if len(data) > limit:
                    raise RequestError(f"the request body is over the limit of {limit} bytes", status=413)
            return bytes(data)

        @app.get("/s/{sid}/v1/models")
        async def models(sid: str, request: Request):
            return refused(request, sid) or {"object": "list", "data": [
                {"id": self.name, "object": "model", "created": 0, "owned_by": "rlft"}]}

        @app.post("/s/{sid}/v1/chat/completions")
        async def chat(sid: str, request: Request):
            if (no := refused(request, sid)) is not None:
                return no
            session, arrived = self.sessions[sid], time.monotonic()
            try:
                if not session.live:
                    raise RequestError("this episode is over (ended, lost, or past its deadline)", status=410)
                req = body_json(await body(request, session), self.limits)
                stream = _streamed(req)  # taken out of the request: the rest is checked as any other
                params = parse(req, self.limits, self.name)
                if params.n != 1:
                    raise RequestError("n must be 1 while training: a prompt's episodes are rlft's group", "n")
            except RequestError as e:
                session.fail(f"request refused ({e.status}): {e}")
                return _error(e)
            loop = asyncio.get_running_loop()
            pending = Pending(session, params, arrived, loop.create_future(), loop)
            self.inbox.put(pending)
            try:
                answer = await asyncio.wait_for(pending.future, max(session.deadline - time.monotonic(), 0.01))
            except asyncio.TimeoutError:
                session.fail("the episode's deadline passed while its call waited")
                return _error(RequestError("the episode's deadline passed", status=504))
            if isinstance(answer, RequestError):
                return _error(answer)
            return _events(answer, stream["include_usage"]) if stream else answer

        @app.post("/s/{sid}/end")
        async def end(sid: str, request: Request):
            if (no := refused(request, sid)) is not None:
                return no
            session = self.sessions[sid]
            try:
                result = body_json(await body(request, session), self.limits)
            except RequestError as e:
                session.fail(f"the agent's outcome was refused: {e}")
                return _error(e)
            _ended(session, result)
            return {"ok": True}

        @app.api_route("/s/{sid}/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
        async def unserved(sid: str, path: str, request: Request):
            # e.g. the Responses API, the OpenAI Agents SDK's default: say what is served, not a bare 404
            if (no := refused(request, sid)) is not None:
                return no
            e = RequestError(f"/v1/{path[:60]} is not served: the gateway speaks Chat Completions (POST "
                             "/v1/chat/completions, GET /v1/models); with the OpenAI Agents SDK use "
                             "OpenAIChatCompletionsModel", status=404, code="not_found")
            self.sessions[sid].fail(f"request refused ({e.status}): {e}")
            return _error(e)

        return app

    # -- the trainer's side -----------------------------------------------------------------------------------
    def open(self, timeout_s: float) -> tuple[str, Endpoint]:
        """A new session, its deadline ``timeout_s`` from now, and the endpoint its agent is handed."""
        sid = uuid.uuid4().hex
        self.sessions[sid] = Session(sid=sid, deadline=time.monotonic() + timeout_s)
        return sid, Endpoint(base_url=f"http://127.0.0.1:{self.port}/s/{sid}/v1", api_key=self.key, model=self.name)

    def end_url(self, sid: str) -> str:
        return f"http://127.0.0.1:{self.port}/s/{sid}/end"

    def drop(self, sids) -> None:
        for sid in sids:
            self.sessions.pop(sid, None)

    def refuse(self, pending: Pending, why: str, status: int = 410) -> None:
        """Answer a waiting request with an error (its episode is over)."""
        _reply(pending, RequestError(why, status=status))

    def take(self, window_s: float = 0.05) -> list[Pending]:
        """The requests waiting: blocks up to ``window_s`` for the first, then collects until every live session
        has one waiting or ``window_s`` has passed since the first came; a session whose agent has not called yet
        is waited for up to ``START_WINDOW_S`` after it opened (the first calls of a prompt's episodes are one
        batch, sharing the prompt's prefill, even when the workers start them a little apart)."""
        try:
            got = [self.inbox.get(timeout=window_s)]
        except queue.Empty:
            return []
        until = time.monotonic() + window_s
        while True:
            waiting, now = {p.session.sid for p in got}, time.monotonic()
            lagging = [s for s in self.sessions.values() if s.live and s.sid not in waiting]
            starting = [s for s in lagging if s.requests == 0 and now < s.opened + START_WINDOW_S]
            if not lagging or (now >= until and not starting):
                return got
            wait = (until if not starting else min(s.opened + START_WINDOW_S for s in starting)) - now
            try:
                got.append(self.inbox.get(timeout=max(wait, 0.001)))
            except queue.Empty:
                if not starting:
                    return got

    def answer(self, pending: list[Pending], sample: Callable[..., Any]) -> None:
        """Answer ``pending`` (see the module's docstring): ``sample(contexts, group_size, max_new_tokens)`` is the
        rollout sampler (``rlft.rollout.hf.turn_sampler``)."""
        ready: list[tuple[Pending, Chain, int]] = []
        for p in pending:
            try:
                chain, budget = self._context(p)
            except RequestError as e:
                if not p.session.truncated:  # a call past a limit ends its episode truncated, not lost
                    p.session.fail(f"request refused ({e.status}): {e}")
                _reply(p, e)
                continue
            ready.append((p, chain, budget))
        if not ready:
            return
        ready.sort(key=lambda r: r[1].prompt + r[1].ids)  # identical contexts side by side: one prefill for each run
        contexts = [c.prompt + c.ids for _, c, _ in ready]
        shared = _shared(contexts)
        width = max(b for _, _, b in ready)
        s = sample(contexts[::shared], shared, width)
        for j, (p, chain, budget) in enumerate(ready):
            n = int(s.response_mask[j].sum())
            logp = s.logprobs[j, :n].tolist() if s.logprobs is not None else [math.nan] * n
            turn = self._cut(s.response_ids[j, :n].tolist(), logp, budget, p.params.stop + self.conv.stops(p.params.tools))
            _reply(p, self._respond(p, chain, turn))

    def _context(self, p: Pending) -> tuple[Chain, int]:
        s = p.session
        if not s.live:
            raise RequestError("this episode is over (ended, lost, or past its deadline)", status=410)
        s.requests += 1
        if s.requests > self.max_turns:
            s.truncated = True
            raise RequestError(f"max_turns: the episode's calls are limited to {self.max_turns}", status=400)
        try:
            text = self.conv.text(p.params.messages, p.params.tools, s.own_text)
        except Exception as e:  # noqa: BLE001  a conversation the template cannot render costs its episode
            raise RequestError(f"the chat template cannot render these messages: {type(e).__name__}: {e}") from None
        chain = s.context(text, self._encode)
        budget = min(p.params.max_tokens, self.max_new_tokens, self.max_tokens - chain.length)
        if budget < 1:
            s.truncated = True
            raise RequestError(f"the episode reached its limit of {self.max_tokens} tokens", status=400)
        return chain, budget

    def _encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def _cut(self, ids: list[int], logp: list[float], budget: int, stops: list[str]) -> Turn:
        """The turn as kept: up to and including its end-of-turn token, or the token that completes a stop text,
        or the budget; the tokens after are dropped (the kept ones are exactly what was sampled)."""
        ids = ids[:budget]
        end = next((k + 1 for k, t in enumerate(ids) if t in self.stop_ids), None)
        stop_at = None
        if stops:
            text = ""
            for k in range(len(ids) if end is None else end):
                text = self.tok.decode(ids[:k + 1], skip_special_tokens=True)
                if any(x in text for x in stops):
                    stop_at = k + 1
                    break
        cut = stop_at or end or len(ids)
        paused = stop_at is not None and any(
            x in self.tok.decode(ids[:cut], skip_special_tokens=True) for x in self.conv.stops(["?"]))
        return Turn(ids[:cut], logp[:cut], end is not None and cut == end, stop_at is not None, paused)

    def _respond(self, p: Pending, chain: Chain, turn: Turn) -> dict:
        s, tok = p.session, self.tok
        raw = tok.decode(turn.ids, skip_special_tokens=False)
        shown = tok.decode(turn.ids, skip_special_tokens=True)
        if turn.stopped and not turn.paused:  # the request's stop text: the reply ends before it (OpenAI's stop)
            shown = shown[:min(shown.find(x) for x in p.params.stop if x in shown)]
        content, calls = self.conv.reply(shown, p.params.tools, p.params.tool_choice)
        message = tok.decode(turn.ids[:-1], skip_special_tokens=False) if turn.ended else raw
        key = call_key(content, [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                                 for c in calls])
        s.sampled(chain, turn.ids, turn.logp, raw, shown, key, message, turn.paused)
        s.latency.append(time.monotonic() - p.arrived)
        s.tools.update(c["function"]["name"] for c in calls)
        self.requests += 1
        self.tokens += len(turn.ids)
        reason = "tool_calls" if calls else "stop" if (turn.ended or turn.stopped) else "length"
        reply: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
        if calls:
            reply["tool_calls"] = calls
        logprobs = None
        if p.params.logprobs:
            special = set(tok.all_special_ids)
            logprobs = {"content": [{"token": tok.decode([t]), "logprob": lp, "bytes": list(tok.decode([t]).encode()),
                                     "top_logprobs": []} for t, lp in zip(turn.ids, turn.logp) if t not in special]}
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.name, "choices": [{"index": 0, "message": reply, "finish_reason": reason,
                                                 "logprobs": logprobs}],
                "usage": {"prompt_tokens": chain.length - len(turn.ids), "completion_tokens": len(turn.ids),
                          "total_tokens": chain.length}}


def _shared(contexts: list[list[int]]) -> int:
    """G when the contexts come in runs of G identical ones (the first calls of a prompt's episodes), else 1."""
    n = len(contexts)
    for g in range(n, 1, -1):
        if n % g == 0 and all(contexts[i] == contexts[i - i % g] for i in range(n)):
            return g
    return 1


def _streamed(req: Any) -> dict | None:
    """A request's ``stream`` and ``stream_options``, taken out of it: None (a plain reply) or ``{"include_usage"}``
    (server-sent events, which streaming clients ask for: the Agents SDK's ``Runner.run_streamed``, LangGraph's
    ``stream_mode="messages"``)."""
    if not isinstance(req, dict):
        return None
    stream, options = req.pop("stream", None), req.pop("stream_options", None)
    if stream not in (None, True, False):
        raise RequestError(f"stream must be true or false, got {stream!r}", "stream")
    if options is not None and (not stream or not isinstance(options, dict) or
                                options.get("include_usage") not in (None, True, False)):
        raise RequestError("stream_options must be {include_usage: true or false}, with stream=true",
                           "stream_options")
    return {"include_usage": bool((options or {}).get("include_usage"))} if stream else None


def _events(answer: dict, include_usage: bool):
    """A reply as Chat Completions' stream: the whole message in one chunk (a turn is sampled at once, so there is
    nothing to send earlier), then its ``finish_reason``, its usage when asked, and ``[DONE]``."""
    from fastapi.responses import StreamingResponse

    choice = answer["choices"][0]
    delta = dict(choice["message"])
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(delta["tool_calls"])]
    head = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"],
            "model": answer["model"], **({"usage": None} if include_usage else {})}
    chunks = [{**head, "choices": [{"index": 0, "delta": delta, "logprobs": choice["logprobs"],
                                    "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                    "finish_reason": choice["finish_reason"]}]}]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": answer["usage"]})
    lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
    return StreamingResponse(iter(lines), media_type="text/event-stream")


def _ended(session: Session, result: Any) -> None:
    """Record the outcome a worker posted: ``{"reward", "info"}`` or ``{"error"}``."""
    if session.ended:
        return
    session.ended = True
    if session.truncated and isinstance(result, dict) and result.get("error") is not None:
        return  # the agent failed on the refusal of a call past a limit: the episode is truncated, as cut there
    if not isinstance(result, dict):
        session.fail("the agent's outcome was not a JSON object")
    elif result.get("error") is not None:
        session.fail(str(result["error"])[:500])
    elif isinstance(result.get("reward"), (int, float)) and not isinstance(result.get("reward"), bool) \
            and math.isfinite(result["reward"]):
        session.reward, session.info = float(result["reward"]), dict(result.get("info") or {})
    else:
        session.fail(f"the agent's reward is not a finite number: {str(result.get('reward'))[:40]}")


def _reply(p: Pending, answer) -> None:
    p.loop.call_soon_threadsafe(_settle, p.future, answer)


def _settle(future, answer) -> None:
    if not future.done():
        future.set_result(answer)


def _error(e: RequestError):
    from fastapi.responses import JSONResponse

    return JSONResponse(e.body, status_code=e.status)
