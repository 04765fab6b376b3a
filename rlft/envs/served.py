"""What environments that talk to a server share: one event loop for their clients, and the servers rlft starts.

:func:`run` runs a coroutine on the process's client loop (an asyncio loop in a daemon thread, started at the first
call) and waits for it: the environment's ``reset`` and ``step`` stay plain calls, under the rollout's deadline
(``env.deadline_s`` interrupts the wait; the coroutine is then cancelled), and every trajectory's client shares the
one thread.

:func:`local_server` serves an ASGI app (a FastAPI app, or a function of no arguments that returns one) with
uvicorn on 127.0.0.1, on a port the system picks, in a daemon thread of this process; one server per app, started at
its first use and shared by every trajectory of the process. :func:`stop_servers` stops them all (the pipeline
calls it when a run ends, and it runs at exit); what :func:`on_stop` registered runs first (closing the sessions
still open). A forked child closes its copies of the listening sockets: no port outlives the process that opened it.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import logging
import os
import socket
import threading
import time
import types
from typing import Any, Callable

logger = logging.getLogger(__name__)

START_S = 30.0  # seconds a local server may take to start
STOP_S = 10.0  # seconds a local server may take to stop

_LOCK = threading.RLock()
_LOOP: list[Any] = [None, None]  # [the clients' loop, its thread]


def run(coro: Any, timeout: float | None = None) -> Any:
    """Run ``coro`` on the clients' loop and wait for it (``timeout`` seconds at most); interrupted (a deadline
    raising in this thread), the coroutine is cancelled."""
    with _LOCK:
        if _LOOP[0] is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="rlft-env-clients", daemon=True)
            thread.start()
            _LOOP[:] = [loop, thread]
        loop = _LOOP[0]
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout)
    except BaseException:
        future.cancel()
        raise


def run_soon(coro: Any, timeout: float) -> None:
    """Run ``coro`` on the clients' loop, waiting for it at most ``timeout`` seconds, ignoring what it raises (a
    connection's best-effort close); on the loop's own thread it is only scheduled; nothing when no loop runs."""
    loop, thread = _LOOP
    if loop is None or not loop.is_running():
        coro.close()
        return
    if threading.current_thread() is thread:  # a finaliser run on the loop itself cannot wait for it
        loop.create_task(coro)
        return
    try:
        run(coro, timeout)
    except Exception:  # noqa: BLE001
        pass


class LocalServer:
    """An ASGI ``app`` served by uvicorn on 127.0.0.1 in a daemon thread, on a port the system picks (``url``)."""

    def __init__(self, app: Any, name: str):
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=2)  # log_config=None: the run's logging stays as it is
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._serve, daemon=True, name=f"rlft-env-server {name}")
        self.thread.start()
        deadline = time.monotonic() + START_S
        try:
            while not self.server.started:
                if not self.thread.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"app: the server of {name} did not start on {self.url} (see the log above)")
                time.sleep(0.01)
        except BaseException:  # it did not start, or a deadline interrupted the wait: nothing is left listening
            self.stop()
            raise
        logger.info("serving %s on %s", name, self.url)

    def _serve(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except SystemExit:  # uvicorn's way to say that the app did not start (logged): the wait below reports it
            pass

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        self.server.should_exit = True
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(STOP_S)
        self.sock.close()


_SERVERS: dict[str, LocalServer] = {}  # app name -> its server, in this process
_ON_STOP: list[Callable[[], None]] = []


def local_server(name: str, app: Any) -> LocalServer:
    """The server of ``app`` (``name``: where it was found), started at the first call of the process."""
    with _LOCK:
        if name not in _SERVERS:
            built = app() if is_factory(app) else app
            _SERVERS[name] = LocalServer(built, name)
        return _SERVERS[name]


def on_stop(fn: Callable[[], None]) -> None:
    """Call ``fn`` before the servers stop (when there are any): to close the sessions still open on them."""
    _ON_STOP.append(fn)


def stop_servers() -> None:
    """Stop every server rlft started in this process (at the end of a run, and at exit); the next episode starts
    its server again."""
    with _LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for fn in _ON_STOP if servers else ():
        fn()
    for server in servers:
        server.stop()


def is_factory(app: Callable) -> bool:
    """A function of no arguments (an ASGI app takes scope, receive and send).

    >>> is_factory(lambda: None), is_factory(lambda scope, receive, send: None), is_factory(object())
    (True, False, False)
    """
    if not isinstance(app, types.FunctionType):
        return False
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in inspect.signature(app).parameters.values())


def _forget_after_fork() -> None:
    """In a forked child: the parent's servers and loop are not here; close the copies of their sockets."""
    global _LOCK
    _LOCK = threading.RLock()  # another thread of the parent may have held it at the fork
    for server in _SERVERS.values():
        try:
            server.sock.close()
        except OSError:
            pass
    _SERVERS.clear()
    _LOOP[:] = [None, None]


atexit.register(stop_servers)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
