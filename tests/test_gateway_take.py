"""The gateway's batching window (``Gateway.take``): what holds a batch open and what closes it."""

from __future__ import annotations

import time

import pytest

from rlft.gateway.server import Gateway, Pending
from rlft.gateway.session import Session
from rlft.models.loading import load_tokenizer


@pytest.fixture(scope="module")
def gateway(tiny_model_dir) -> Gateway:
    return Gateway(load_tokenizer(str(tiny_model_dir)))  # not started: take() reads only the inbox and sessions


def _sessions(gw: Gateway, *sids: str) -> list[Session]:
    gw.sessions = {sid: Session(sid=sid, deadline=time.monotonic() + 60) for sid in sids}
    return list(gw.sessions.values())


def _call(gw: Gateway, session: Session) -> None:
    gw.inbox.put(Pending(session, params=None, arrived=time.monotonic(), future=None, loop=None))


def _timed_take(gw: Gateway, window_s: float):
    t0 = time.monotonic()
    got = gw.take(window_s)
    return [p.session.sid for p in got], time.monotonic() - t0


def test_the_batch_closes_at_once_when_every_live_session_has_a_call_waiting(gateway):
    a, b, c = _sessions(gateway, "a", "b", "c")
    c.ended = True
    _call(gateway, a)
    _call(gateway, b)
    sids, took = _timed_take(gateway, 5.0)
    assert sids == ["a", "b"] and took < 1.0


def test_a_session_still_live_holds_the_batch_for_the_window_only(gateway):
    a, b = _sessions(gateway, "a", "b")
    b.requests = 1  # b's agent called before: it is busy with its own work (a tool), not starting
    _call(gateway, a)
    sids, took = _timed_take(gateway, 0.3)
    assert sids == ["a"] and 0.29 < took < 2.0
    assert _timed_take(gateway, 0.2)[0] == []  # nothing waiting: empty after the window


def test_a_session_yet_to_make_its_first_call_holds_the_batch_until_the_start_window(gateway, monkeypatch):
    from rlft.gateway import server

    monkeypatch.setattr(server, "START_WINDOW_S", 1.0)
    a, b = _sessions(gateway, "a", "b")  # b's agent is still starting (its worker, its client)
    _call(gateway, a)
    sids, took = _timed_take(gateway, 0.05)
    assert sids == ["a"] and 0.9 < took < 3.0  # held for b's first call up to 1 s after b opened, not 0.05 s

