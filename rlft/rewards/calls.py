"""One reward's calls for one batch, run concurrently on a few threads, each with a time limit; a hang costs its
limit once per batch, not once per sample.

``score_batch`` hands every in-process reward's calls for a batch (one per sample, per group, or one for a batched
reward) to :func:`run_calls`:

- up to :data:`THREADS` calls run at once, each in a daemon thread, so calls that wait (a network request, a
  subprocess, a sleep) overlap; calls that compute share the interpreter's lock, so a call's time counts while it
  waits for the others (a reward needing more than ``limit / THREADS`` seconds of computation per call belongs in
  the worker pool, ``pool.runs_in_pool`` or ``slow: true``, where calls run in parallel processes);
- a call that runs longer than ``limit`` seconds from its own start is given up: its outcome is
  :class:`RewardTimeout`, and a ``RewardTimeout`` is raised inside its thread, which stops Python code at its next
  instruction (a ``BaseException``, so ``except Exception`` does not swallow it);
- the first timeout of the batch stops the reward for the rest of the batch: its calls not yet started are not
  made, their outcome is :class:`NotCalled`. With every call hanging, the batch costs the reward's limit once
  (the calls running then all time out together), not once per sample;
- a thread blocked outside Python (in a C function, a sleep, a socket read) cannot be stopped from another thread:
  it is left to finish on its own, counted by :func:`left_running` and logged. Its result is discarded.

Calls run in threads, never under ``SIGALRM``, so the same rules hold in the main thread and off it (``train.async``
scores in the rollout's thread), and a ``SIGINT`` / ``SIGTERM`` handler runs while the caller waits. What torch keeps
per thread is carried over from the caller: its CUDA device (under ``accelerate launch`` each process's own GPU; a
new thread would start on the first) and whether gradients are on.
"""

from __future__ import annotations

import itertools
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence

logger = logging.getLogger("rlft.rewards")

THREADS = 8
"""Calls of one reward that run at once."""

_GIVEN_UP: dict[int, threading.Thread] = {}  # threads whose call was given up at its limit, by their order (pruned as they end)
_GIVEN_UP_SO_FAR = [0]  # how many calls this process has given up, ever: a run counts its own from here
_GIVEN_UP_LOCK = threading.Lock()


class RewardTimeout(BaseException):
    """A call that ran past its time limit; a BaseException so ``except Exception`` in the reward does not swallow
    it when it is raised inside the call."""


class NotCalled(Exception):
    """A call not made: an earlier call of the same reward timed out in this batch."""


def run_calls(fn: Callable, calls: Sequence[tuple], limit: float) -> list[tuple[bool, object]]:
    """``fn(*args)`` for every ``args`` of ``calls``, concurrently (see the module's docstring): per call,
    ``(True, value)`` or ``(False, exception)`` (the reward's own, :class:`RewardTimeout` or :class:`NotCalled`)."""
    n = len(calls)
    if n == 0:
        return []
    outcomes: list[tuple[bool, object] | None] = [None] * n
    started: dict[int, tuple[float, int]] = {}  # index -> (monotonic start, thread ident); set by the workers
    results: queue.SimpleQueue = queue.SimpleQueue()
    counter = itertools.count()  # next(counter) is atomic: each index is taken by one worker
    stopped = [False]  # set by the caller at the first timeout: no further call starts
    enter = _caller_context()

    def work() -> None:
        try:
            enter()
            while True:
                i = next(counter)
                if i >= n or stopped[0]:
                    return
                started[i] = (time.monotonic(), threading.get_ident())
                try:
                    outcome = (True, fn(*calls[i]))
                except BaseException as e:  # noqa: BLE001 -- the reward's failure is its sample's outcome
                    outcome = (False, e)
                results.put((i, outcome))
        except BaseException:  # noqa: BLE001 -- a RewardTimeout raised after its call was given up: the thread ends
            return

    threads = [threading.Thread(target=work, name="rlft-reward-call", daemon=True) for _ in range(min(THREADS, n))]
    for t in threads:
        t.start()
    while True:
        try:
            i, outcome = results.get(timeout=_wait(started, outcomes, limit))
            if outcomes[i] is None:  # not given up already
                outcomes[i] = outcome
            if all(o is not None for o in outcomes):
                break
            continue
        except queue.Empty:
            pass
        now = time.monotonic()
        for i, (t0, ident) in list(started.items()):
            if outcomes[i] is None and now - t0 >= limit:
                outcomes[i] = (False, RewardTimeout(f"timed out after {limit:g}s"))
                stopped[0] = True
                _give_up(ident, threads)
        busy = any(outcomes[i] is None for i in list(started))
        if not busy and (stopped[0] or all(o is not None for o in outcomes)):
            break
    skipped = NotCalled(f"not called: an earlier call timed out after {limit:g}s in this batch")
    return [o if o is not None else (False, skipped) for o in outcomes]


def _caller_context() -> Callable[[], None]:
    """What a worker thread runs first to take the caller's per-thread torch state (CUDA device, grad mode); nothing
    when torch is not imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return lambda: None
    grad = torch.is_grad_enabled()
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

    def enter() -> None:
        torch.set_grad_enabled(grad)
        if device is not None:
            torch.cuda.set_device(device)

    return enter


def _wait(started: dict[int, tuple[float, int]], outcomes: list, limit: float) -> float:
    """How long the caller may wait for the next result: until the earliest running call's limit."""
    running = [t0 for i, (t0, _) in list(started.items()) if outcomes[i] is None]
    if not running:
        return 0.01  # the workers are between calls
    return max(min(running) + limit - time.monotonic(), 0.0) + 1e-3


def _give_up(ident: int, threads: list[threading.Thread]) -> None:
    """Raise RewardTimeout in the worker thread ``ident`` (it stops at its next Python instruction) and count it
    until it ends."""
    thread = next((t for t in threads if t.ident == ident), None)
    if thread is None or not thread.is_alive():
        return
    try:
        import ctypes

        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(RewardTimeout))
    except (ImportError, AttributeError):  # not CPython: the thread is left to finish its call
        pass
    with _GIVEN_UP_LOCK:
        _GIVEN_UP[_GIVEN_UP_SO_FAR[0]] = thread
        _GIVEN_UP_SO_FAR[0] += 1


def given_up_so_far() -> int:
    """How many calls this process has given up at their limit: a run records it at its start, and counts in
    ``left_running(since=...)`` only its own (an earlier run of the same process, e.g. in a notebook, may have
    left threads running: they are not this run's)."""
    with _GIVEN_UP_LOCK:
        return _GIVEN_UP_SO_FAR[0]


def left_running(since: int = 0) -> int:
    """Calls given up at their limit whose threads still run (blocked outside Python, or ignoring the timeout),
    among those given up after the first ``since`` (:func:`given_up_so_far`); 0: all of this process's."""
    with _GIVEN_UP_LOCK:
        for order in [o for o, t in _GIVEN_UP.items() if not t.is_alive()]:
            del _GIVEN_UP[order]
        return sum(order >= since for order in _GIVEN_UP)
