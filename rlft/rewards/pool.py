"""Slow reward checkers in worker processes, with a deadline per sample.

``scoring.py`` times a reward out with ``SIGALRM``, which works only in the main
thread of the main interpreter. A checker that may be slow or hang (symbolic
math, running code) runs here instead: a :class:`RewardPool` keeps a few worker
processes (a maintained pool, ``pebble``) for the whole run, and
:meth:`RewardPool.score` sends one task per sample with its own deadline.

- A task that runs past its deadline is stopped: pebble terminates its worker
  and starts a fresh one. That sample is lost, and so are the samples of the
  same call of :meth:`RewardPool.score` not queued yet (at most two per worker
  are queued at a time): they are not run, so a
  checker that hangs on every sample costs its deadline once per batch, not once
  per sample (the tasks already running keep their own deadlines).
- A worker that dies (``os._exit``, a segfault, the kernel's OOM killer) costs
  only the sample it was running.
- A checker that raises, or returns anything but ``None`` or a finite number,
  also costs only its sample.

Every lost sample is scored ``None`` (unscorable, so it stays out of its group's
baseline; never a silent 0), counted, and the first failure is logged. The
caller only waits on futures, so this works from any thread. Functions must be
picklable (module-level functions, or instances of module-level classes). A
checker that enforces its own inner timeout (running code) exposes a longer
``deadline_s`` attribute, so its own limit decides the verdict and the pool's
deadline only catches a checker that is itself stuck.
Workers start from a ``forkserver`` where the platform has one, so they do not
inherit the trainer's threads or CUDA state.

A reward declares itself slow with :func:`runs_in_pool`. While a pool is
activated (``with pool.activated():``, as ``rlft train`` does for the whole run
when a configured reward is slow), ``score_batch`` sends slow rewards to it and
keeps cheap ones in-process. Without an active pool a slow reward runs in-process
under the ``SIGALRM`` deadline of ``scoring.py``.

The same workers run other slow work with a deadline per task (:meth:`RewardPool.submit`
and :func:`result`): the multi-turn rollout steps slow environments there
(``rlft.rollout.env_steps``).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, Future, TimeoutError as FutureTimeout, wait
from dataclasses import dataclass
from typing import Any

from pebble import ProcessExpired, ProcessPool

from rlft.rewards.base import checked_value

logger = logging.getLogger("rlft.rewards")

_active: "RewardPool | None" = None  # the pool of the running job, visible from every thread
_active_lock = threading.Lock()


def runs_in_pool(fn: Callable) -> Callable:
    """Mark a reward function as slow: while a pool is active, ``score_batch`` runs it there."""
    fn.runs_in_pool = True
    return fn


def active_pool() -> "RewardPool | None":
    """The pool activated by the running job, if any."""
    return _active


class NotRun(RuntimeError):
    """A sample of :meth:`RewardPool.score` not run: an earlier sample of the same call ran past its deadline."""


class TaskLost(RuntimeError):
    """A task of :meth:`RewardPool.submit` that ran past its deadline (its worker was stopped) or whose worker
    died."""


@dataclass
class PoolResult:
    values: list[float | None]  # (B,) one per sample; None where the sample was lost
    errors: int  # samples lost to a deadline, a dead worker, an exception or a bad return value
    first_error: str | None = None  # "sample <i>: <what went wrong>"
    first: tuple[int, str] | None = None  # the same as (sample index, what went wrong)


class RewardPool:
    """``workers`` processes that score ``fn(completion, sample)`` with a deadline of ``deadline_s`` per sample.

    Create it once per run and close it at the end (or use it as a context manager).
    """

    def __init__(self, workers: int = 2, deadline_s: float = 5.0):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        self.deadline_s = deadline_s
        self.workers = workers
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        self._pool = ProcessPool(max_workers=workers, context=context)

    def score(self, fn: Callable[[str, Mapping], float | None], completions: Sequence[str],
              samples: Sequence[Mapping], name: str = "") -> PoolResult:
        """``fn`` on every (completion, sample) pair, in order; a lost sample is ``None`` and counted."""
        if len(completions) != len(samples):
            raise ValueError(f"got {len(completions)} completions but {len(samples)} samples")
        deadline = getattr(fn, "deadline_s", None) or self.deadline_s  # a checker with its own inner timeout
        futures = self._until_timeout(fn, list(zip(completions, samples)), deadline)
        values: list[float | None] = []
        errors, first = 0, None
        for i, future in enumerate(futures):
            try:
                if future is None:
                    raise NotRun("not run: an earlier sample of this batch timed out")
                values.append(checked_value(future.result()))
            except Exception as e:  # the deadline, a dead worker, the checker's own error, a bad value, not run
                values.append(None)
                errors += 1
                if first is None or (isinstance(first[2], NotRun) and not isinstance(e, NotRun)):
                    first = (i, _describe(e, deadline), e)
        text = None if first is None else f"sample {first[0]}: {first[1]}"
        if errors:
            logger.warning("reward %r lost %d/%d samples in the worker pool (scored None); first: %s",
                           name or getattr(fn, "__name__", fn), errors, len(values), text)
        return PoolResult(values=values, errors=errors, first_error=text, first=first and first[:2])

    def _until_timeout(self, fn: Callable, calls: list[tuple], deadline: float) -> list[Future | None]:
        """``fn(*args)`` per ``calls`` in the workers, at most two per worker queued at a time, so that none is
        started after the first one runs past ``deadline`` (None: not started)."""
        futures: list[Future | None] = [None] * len(calls)
        in_flight: set[Future] = set()
        queued, stop = 0, False
        while True:
            while not stop and queued < len(calls) and len(in_flight) < 2 * self.workers:
                futures[queued] = self._pool.schedule(fn, args=calls[queued], timeout=deadline)
                in_flight.add(futures[queued])
                queued += 1
            if not in_flight:
                return futures
            done, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
            stop = stop or any(isinstance(f.exception(), FutureTimeout) for f in done)

    def submit(self, fn: Callable, args: tuple, deadline_s: float) -> Future:
        """``fn(*args)`` in a worker, stopped ``deadline_s`` after it starts there; :func:`result` waits for it.
        ``fn`` and ``args`` must pickle."""
        return self._pool.schedule(fn, args=args, timeout=deadline_s)

    @contextmanager
    def activated(self) -> Iterator["RewardPool"]:
        """Make this the active pool for the block, then close it."""
        global _active
        with _active_lock:
            if _active is not None:
                raise RuntimeError("another reward pool is already active")
            _active = self
        try:
            yield self
        finally:
            with _active_lock:
                _active = None
            self.close()

    def close(self) -> None:
        """Stop the workers (a task still running is terminated) and wait for them to exit."""
        self._pool.stop()
        self._pool.join()

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def result(future: Future, deadline_s: float) -> Any:
    """The value of a task :meth:`RewardPool.submit` sent with ``deadline_s``: a :class:`TaskLost` when it ran
    past its deadline or its worker died, else what the task raised."""
    try:
        return future.result()
    except (FutureTimeout, ProcessExpired) as e:
        raise TaskLost(_describe(e, deadline_s)) from None


def _describe(e: BaseException, deadline_s: float) -> str:
    if isinstance(e, FutureTimeout):
        return f"timed out after {deadline_s}s"
    if isinstance(e, NotRun):
        return str(e)
    if isinstance(e, ProcessExpired):
        return f"worker died (exit code {e.exitcode})"
    return f"{type(e).__name__}: {e}"
