"""Score a batch of completions with several reward functions.

A reward function that raises, runs past ``timeout_s`` or returns something
other than ``None``, a bool (0 or 1) or a finite real number costs only that sample (for a
group-level or batched reward, the samples of that call; but a batched reward's
values each depend on their own sample only, so one bad value in a well-formed
list costs that sample alone): its value
is ``None`` (unscorable, excluded downstream -- never a silent 0), the failure
is counted in ``ScoreResult.errors``, the first one kept in ``ScoreResult.first_errors`` and logged once per
function per batch on the ``rlft.rewards`` logger.

Time is bounded per batch, not per sample: a reward's calls for the batch run concurrently on a few threads, each
with ``timeout_s`` from its own start, and the first call that runs past it stops that reward for the rest of the
batch (its calls not yet started are not made and count as failures), so a reward that hangs on every sample costs
about ``timeout_s`` per batch (``rlft.rewards.calls``). A timed-out call is interrupted where it runs Python code;
one blocked outside Python is left to finish in its daemon thread, counted and its result discarded. A reward that
may hang or compute for long declares itself slow (``pool.runs_in_pool``) and runs in the active ``RewardPool``:
worker processes, stopped at their deadline, under the same rule for the batch.
"""

from __future__ import annotations

import logging
import math
import numbers
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rlft.registry import Registry
from rlft.rewards.base import REWARDS, checked_value, is_batched, is_group_level, is_step_level
from rlft.rewards.calls import NotCalled, RewardTimeout, run_calls
from rlft.rewards.pool import active_pool

logger = logging.getLogger("rlft.rewards")


@dataclass
class ScoreResult:
    total: list[float | None]  # (B,) weighted sum; None if a weighted component is None
    per_fn: dict[str, list[float | None]]  # name -> (B,)
    errors: dict[str, int]  # name -> number of samples that raised / timed out / returned junk
    steps: dict[str, list[list[tuple[int, float | None]]]] = field(default_factory=dict)  # step-level name -> (B,)
    first_errors: dict[str, tuple[int, str]] = field(default_factory=dict)  # name -> (sample, "Type: message")


Term = "str | tuple[str, Callable]"  # a registered name (default parameters), or (label, built reward)


def score_batch(
    completions: Sequence[str],
    samples: Sequence[Mapping],
    fns: Sequence[Term],
    weights: Sequence[float],
    timeout_s: float = 5.0,
    *,
    registry: Registry | None = None,
    group_size: int = 1,
) -> ScoreResult:
    """Apply each reward to the (completion, sample) pairs and combine them with ``weights``.

    ``fns`` holds registered names (looked up in ``registry``, by default
    ``rlft.rewards.REWARDS``, with default parameters) or ``(label, fn)`` pairs
    of built rewards; results are keyed by name or label. Group-level rewards
    are called once per contiguous group of ``group_size`` samples, batched ones
    once on the whole batch; a failure costs the samples of that call, except that a batched reward whose call
    raised is called again on each sample alone, so that one bad sample costs only itself (a call that timed out
    costs its samples). A reward
    with a ``deadline_s`` attribute gets that instead of ``timeout_s``. A
    component with weight 0 is reported in ``per_fn`` but cannot make ``total``
    None. A per-sample reward marked ``runs_in_pool`` is scored in the active
    ``RewardPool`` when there is one. A step-level reward is called per sample
    in this process: its checked steps go to ``ScoreResult.steps`` (a failing
    sample has none) and its value is the mean of its scorable step rewards.
    """
    registry = REWARDS if registry is None else registry
    table = dict(_resolve(fn, registry) for fn in fns)  # unknown names fail before any scoring
    _check_args(completions, samples, fns, table, weights, timeout_s, group_size)
    pool = active_pool()
    per_fn, errors, steps, first = {}, {}, {}, {}
    for name, fn in table.items():
        limit = getattr(fn, "deadline_s", None) or timeout_s  # a reward with its own deadline keeps it
        failed = _Failures()
        if is_step_level(fn):  # per sample, in this process; its value is the mean scorable step reward
            steps[name] = _score_steps(fn, completions, samples, limit, failed)
            per_fn[name] = [_mean_step(x) for x in steps[name]]
        elif is_group_level(fn) or is_batched(fn):
            size = group_size if is_group_level(fn) else max(1, len(completions))
            per_fn[name] = _score_lists(fn, completions, samples, size, limit, failed,
                                        per_value=is_batched(fn) and not is_group_level(fn))
        elif pool is not None and getattr(fn, "runs_in_pool", False):  # slow checkers: worker processes
            result = pool.score(fn, completions, samples, name=name)  # which logs its own failures
            per_fn[name], errors[name] = result.values, result.errors
            if result.first is not None:
                first[name] = result.first
            continue
        else:
            per_fn[name] = _score_one_fn(fn, completions, samples, limit, failed)
        errors[name] = failed.count
        if failed.first is not None:
            first[name] = failed.first
        _warn(name, failed, len(completions))
    total = [_combine([per_fn[n][i] for n in table], weights) for i in range(len(completions))]
    return ScoreResult(total=total, per_fn=per_fn, errors=errors, steps=steps, first_errors=first)


class _Failures:
    """A reward's failures in one batch: how many samples, and the first (sample index, "Type: message")."""

    def __init__(self):
        self.count, self.first, self._not_called = 0, None, False

    def add(self, index: int, e: BaseException, n: int = 1) -> None:
        """``n`` samples from ``index`` on failed with ``e``; the first failure kept is the earliest one that is not
        a call left out after a timeout (the timeout says why)."""
        self.count += n
        if self.first is None or (self._not_called and not isinstance(e, NotCalled)):
            self.first, self._not_called = (index, f"{type(e).__name__}: {e}"), isinstance(e, NotCalled)


def _resolve(term, registry) -> tuple[str, Callable]:
    if isinstance(term, str):
        return term, registry.get(term)
    label, fn = term
    return label, fn


def _check_args(completions, samples, fns, table, weights, timeout_s, group_size) -> None:
    if len(completions) != len(samples):
        raise ValueError(f"got {len(completions)} completions but {len(samples)} samples")
    if not fns:
        raise ValueError("fns: need at least one reward function")
    if len(fns) != len(weights):
        raise ValueError(f"fns has {len(fns)} names but weights has {len(weights)} values")
    if len(table) != len(fns):
        raise ValueError(f"fns: duplicate names in {[t if isinstance(t, str) else t[0] for t in fns]}")
    if not all(math.isfinite(w) for w in weights):
        raise ValueError(f"weights must be finite, got {list(weights)}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if group_size < 1 or len(completions) % group_size:
        raise ValueError(f"group_size {group_size} does not divide the batch of {len(completions)}")


def _combine(values: list[float | None], weights: Sequence[float]) -> float | None:
    if any(v is None and w != 0 for v, w in zip(values, weights)):
        return None
    return float(sum(w * v for v, w in zip(values, weights) if w != 0))


def _score_one_fn(fn, completions, samples, timeout_s, failed: _Failures) -> list[float | None]:
    values = []
    for i, (ok, got) in enumerate(run_calls(fn, list(zip(completions, samples)), timeout_s)):
        try:
            if not ok:
                raise got
            values.append(checked_value(got))
        except (Exception, RewardTimeout) as e:
            values.append(None)
            failed.add(i, e)
    return values


def _score_steps(fn, completions, samples, timeout_s, failed: _Failures) -> list[list[tuple[int, float | None]]]:
    """A step-level reward per sample; a failing sample has no steps (and so the value None)."""
    values = []
    for i, (ok, got) in enumerate(run_calls(fn, list(zip(completions, samples)), timeout_s)):
        try:
            if not ok:
                raise got
            values.append(checked_steps(got, len(completions[i])))
        except (Exception, RewardTimeout) as e:
            values.append([])
            failed.add(i, e)
    return values


def checked_steps(value: object, n_chars: int) -> list[tuple[int, float | None]]:
    """A step-level reward's value as ``[(end_char, reward)]``; raises on anything else.

    ``end_char`` is an int in ``[0, n_chars]``, strictly increasing; ``reward`` passes :func:`checked_value`.
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"returned {type(value).__name__}, expected a list of (end_char, reward) steps")
    out: list[tuple[int, float | None]] = []
    for step in value:
        if isinstance(step, (str, bytes)) or not isinstance(step, Sequence) or len(step) != 2:
            raise TypeError(f"step {step!r}: expected a pair (end_char, reward)")
        end, reward = step
        last = out[-1][0] if out else -1
        if isinstance(end, bool) or not isinstance(end, numbers.Integral) or not last < end <= n_chars:
            raise ValueError(f"step {step!r}: end_char must be an int in ({last}, {n_chars}] "
                             "(offsets in the completion, increasing)")
        out.append((int(end), checked_value(reward)))
    return out


def _mean_step(steps: list[tuple[int, float | None]]) -> float | None:
    ok = [r for _, r in steps if r is not None]
    return sum(ok) / len(ok) if ok else None


def _score_lists(fn, completions, samples, size, timeout_s, failed: _Failures,
                 per_value: bool = False) -> list[float | None]:
    """A list-valued reward on consecutive chunks of ``size`` samples; a failing chunk costs its samples.
    ``per_value`` (a batched reward): a bad value in a well-formed list costs its own sample only, and a call that
    raised is made again on each of its samples alone (one that timed out is not: it could hang as many times)."""
    starts = list(range(0, len(completions), size))
    calls = [(list(completions[k:k + size]), list(samples[k:k + size])) for k in starts]
    values: list[float | None] = []
    for start, (c, s), (ok, got) in zip(starts, calls, run_calls(fn, calls, timeout_s)):
        try:
            if not ok:
                raise got
            out = _checked_list(got, len(c), per_value)
        except (RewardTimeout, NotCalled) as e:
            out = [None] * len(c)
            failed.add(start, e, len(c))
        except Exception as e:
            if per_value and len(c) > 1:  # a batched reward that threw: each sample alone, so a bad one costs itself
                values.extend(_one_by_one(fn, c, s, start, timeout_s, failed))
                continue
            out = [None] * len(c)
            failed.add(start, e, len(c))
        else:
            for i, v in enumerate(out if per_value else ()):
                try:
                    out[i] = checked_value(v)
                except (TypeError, ValueError) as e:
                    out[i] = None
                    failed.add(start + i, e)
        values.extend(out)
    return values


def _checked_list(out, n: int, per_value: bool) -> list:
    """A list-valued reward's return value: a list of ``n`` values (checked here unless ``per_value``)."""
    if not isinstance(out, Sequence) or isinstance(out, str) or len(out) != n:
        raise TypeError(f"returned {type(out).__name__}, expected a list of {n} values")
    return list(out) if per_value else [checked_value(v) for v in out]


def _one_by_one(fn, completions, samples, start: int, timeout_s: float, failed: _Failures) -> list[float | None]:
    """A batched reward called on one sample at a time (after the whole call threw)."""
    out = []
    for i, (ok, got) in enumerate(run_calls(fn, [([c], [s]) for c, s in zip(completions, samples)], timeout_s)):
        try:
            if not ok:
                raise got
            out.append(checked_value(_checked_list(got, 1, True)[0]))
        except (Exception, RewardTimeout) as e:
            out.append(None)
            failed.add(start + i, e)
    return out


def _warn(name: str, failed: _Failures, n: int) -> None:
    if failed.count:
        index, text = failed.first
        logger.warning("reward %r failed on %d/%d samples (scored None); first: sample %d: %s", name, failed.count,
                       n, index, text)


def _alarm_available() -> bool:
    return (
        hasattr(signal, "SIGALRM")
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )


def _call_in_thread(fn: Callable, args: tuple, timeout_s: float):
    """``fn(*args)`` in a daemon thread, waited for ``timeout_s`` at most (RewardTimeout after that)."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = fn(*args)
        except BaseException as e:  # handed to the caller below
            result["error"] = e

    worker = threading.Thread(target=run, name="rlft-reward-call", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise RewardTimeout(f"timed out after {timeout_s}s (left running in its thread)")
    if "error" in result:
        raise result["error"]
    return result["value"]


def call_with_timeout(fn: Callable, args: tuple, timeout_s: float):
    """``fn(*args)``, interrupted after ``timeout_s`` where SIGALRM is usable; elsewhere (a thread other than the
    main one, as train.async's rollout thread) run in a daemon thread of its own and given up after ``timeout_s``:
    RewardTimeout is raised and the call is left to finish on its own (a thread cannot be stopped)."""
    if not _alarm_available():
        return _call_in_thread(fn, args, timeout_s)
    state = {"armed": True, "fired": False}

    def on_alarm(signum, frame):
        if state["armed"]:
            state["fired"] = True
            raise RewardTimeout(f"timed out after {timeout_s}s")

    try:
        previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    except ValueError:  # not the main interpreter
        return _call_in_thread(fn, args, timeout_s)
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, timeout_s)
    start = time.monotonic()
    try:
        value = fn(*args)
        state["armed"] = False
    finally:
        state["armed"] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_delay > 0:  # re-arm the caller's timer with what is left of it
            left = max(previous_delay - (time.monotonic() - start), 1e-6)
            signal.setitimer(signal.ITIMER_REAL, left, previous_interval)
    if state["fired"]:  # the fn caught the timeout and carried on
        raise RewardTimeout(f"timed out after {timeout_s}s")
    return value
