"""The HTTP shell of ``rlft serve``: FastAPI routes over :class:`rlft.serve.core.Policy`, run by uvicorn.

``POST /v1/chat/completions`` and ``GET /v1/models``; with an API key, a request without ``Authorization: Bearer
<key>`` is a 401. One request at a time goes through the model (a lock): others wait their turn.
"""

import hmac  # no `from __future__ import annotations`: FastAPI reads the routes' annotations (Request) at runtime
import signal
import threading

from rlft.config.extras import require
from rlft.serve.core import Policy, RequestError


def build_app(policy: Policy, api_key: str | None = None):
    """The FastAPI application serving ``policy`` (``api_key``: the bearer token every request must carry)."""
    require("fastapi", "rlft serve")
    from fastapi import FastAPI, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse

    app, lock = FastAPI(title="rlft serve", docs_url=None, redoc_url=None, openapi_url=None), threading.Lock()

    def refused(request: Request) -> JSONResponse | None:
        given = request.headers.get("authorization", "")
        if api_key is None or hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            return None
        return JSONResponse({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                       "param": None, "code": "invalid_api_key"}}, status_code=401)

    @app.get("/v1/models")
    async def models(request: Request):
        return refused(request) or {"object": "list", "data": [
            {"id": policy.name, "object": "model", "created": 0, "owned_by": "rlft"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        if (no := refused(request)) is not None:
            return no
        body, limit = bytearray(), policy.limits.max_body_bytes
        async for chunk in request.stream():  # read no further than the bound
            body += chunk
            if len(body) > limit:
                e = RequestError(f"the request body is over the limit of {limit} bytes", status=413)
                return JSONResponse(e.body, status_code=e.status)

        def run():
            with lock:
                return policy.handle(bytes(body))
        try:
            response, _ = await run_in_threadpool(run)
        except RequestError as e:
            return JSONResponse(e.body, status_code=e.status)
        return response

    return app


def serve(policy: Policy, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None) -> None:
    """Serve ``policy`` until SIGINT or SIGTERM: uvicorn finishes the request in flight and closes the port, then
    the signal goes on (SIGINT: ``KeyboardInterrupt``; SIGTERM: ``SystemExit(143)``, the usual exit status)."""
    app = build_app(policy, api_key)
    require("uvicorn", "rlft serve")
    import uvicorn

    print(f"rlft serve: {policy.name} on http://{host}:{port}/v1 ({'API key required' if api_key else 'no API key'})",
          flush=True)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
    previous = signal.signal(signal.SIGTERM, _terminated)  # uvicorn raises the signal again once it has stopped
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminated(signum, frame) -> None:
    raise SystemExit(128 + signum)
