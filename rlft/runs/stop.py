"""Stopping a run on SIGINT and SIGTERM: promptly, with a checkpoint where one can be written, and one line.

The command line installs :func:`handling` once for a command that trains or evaluates (``rlft.cli.main``). A
first Ctrl-C (SIGINT) or a SIGTERM asks the run to stop: it is acknowledged on the console at once (``ACK`` for
Ctrl-C) and recorded, and :func:`requested` says which signal it was. Every training loop asks between its steps
and, when asked to stop, writes its checkpoint and raises :func:`halted`'s error (``rlft`` exits 128 + the
signal's number: 130 for SIGINT, 143 for SIGTERM, with one line). The long phases inside a step (a generation of
many tokens, an evaluation) call :func:`check`, which raises :class:`Stopping`: the step is abandoned and the loop
writes the checkpoint of the last step it finished.

A second Ctrl-C stops now: :class:`StoppedNow` (a ``KeyboardInterrupt``) unwinds through every ``finally``, so a
checkpoint being written leaves only its temporary directory, which is removed (``rlft.runs.checkpoint.write_dir``),
never a half-written final one; ``rlft`` exits 130 with one line.

Under several processes (``accelerate launch`` / ``torchrun``) :func:`check` does nothing: the loops stop together
after a step, on the main process's signal (``Dist.broadcast``), since one process leaving a step alone would
leave the others waiting for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Iterator

from rlft.errors import TrainingHalted

ACK = "stopping after this step; press again to stop now"
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopping(TrainingHalted):
    """A stop signal arrived during a long phase (:func:`check`): the phase is abandoned. A loop that can write a
    checkpoint catches it; otherwise it ends the command with ``exit_code`` 128 + the signal's number."""

    def __init__(self, signum: int, during: str = ""):
        self.signum = signum
        super().__init__(f"{signal.Signals(signum).name}{' during ' + during if during else ''}",
                         exit_code=128 + signum)


class UpdateAbandoned(Stopping):
    """A stop signal's grace ran out while an RL step's update was running (:func:`check_update`): the weights are
    part-way through that update, so no checkpoint can be written from them; the run ends at its last checkpoint."""


class StoppedNow(KeyboardInterrupt):
    """A second Ctrl-C: the run stops at once, wherever it was."""


class _State:
    signum: int | None = None  # the first stop signal received while :func:`handling` is active
    at: float = 0.0  # when it arrived (time.monotonic)
    active: bool = False


_STATE = _State()


def requested() -> int | None:
    """The stop signal received since :func:`handling` began (SIGINT or SIGTERM), or None."""
    return _STATE.signum


def due() -> bool:
    """Whether a long phase running here should end now: a stop was asked for, this is the main thread (a
    background rollout is joined by the loop) and the only process (several stop together after a step)."""
    if _STATE.signum is None or threading.current_thread() is not threading.main_thread():
        return False
    from rlft.parallel.dist import current

    return not current().active


def check(during: str = "") -> None:
    """Raise :class:`Stopping` when :func:`due` (``during``: the phase, for the message)."""
    if due():
        raise Stopping(_STATE.signum, during)


def check_update(grace_s: float) -> None:
    """Raise :class:`UpdateAbandoned` when :func:`due` and the signal came more than ``grace_s`` seconds ago: an
    update (optimizer steps over the step's mini-batches) is let finish, so that its step can be checkpointed, but
    not past the grace (``train.stop_grace_s``), so that a long update still stops within it."""
    if due() and time.monotonic() - _STATE.at > grace_s:
        raise UpdateAbandoned(_STATE.signum, "the update")


def halted(signum: int, where: str, ckpt=None, then: str = "") -> TrainingHalted:
    """The error that ends a run stopped by ``signum`` ``where`` (e.g. "after SFT step 12"), naming the checkpoint
    it wrote (``ckpt``) and how to continue from it, or saying ``then`` instead."""
    name = signal.Signals(signum).name
    then = then or (f"checkpoint {ckpt} written; train.resume=true continues from it" if ckpt is not None else
                    "no checkpoint written")
    return TrainingHalted(f"{name} {where}: {then}", exit_code=128 + signum)


def _say(text: str) -> None:
    """One line on stderr from a signal handler: written straight to the file descriptor (the handler may run while
    the main thread is inside a buffered write to stderr, such as a progress bar's)."""
    lead = "\n" if sys.stderr.isatty() else ""
    try:
        os.write(sys.stderr.fileno(), f"{lead}rlft: {text}\n".encode())
    except (OSError, ValueError, AttributeError):  # no stderr to write to: the stop is still recorded
        pass


def _handle(signum: int, frame) -> None:
    if _STATE.signum is not None:
        if signum == signal.SIGINT:  # pressed again: stop now
            raise StoppedNow
        return  # a repeated SIGTERM: the stop is on its way
    _STATE.signum, _STATE.at = signum, time.monotonic()
    _say(ACK if signum == signal.SIGINT else
         f"{signal.Signals(signum).name}: stopping after this step (a checkpoint first where one can be written)")


@contextlib.contextmanager
def handling() -> Iterator[None]:
    """SIGINT and SIGTERM ask the run to stop while inside (see the module's text); the previous handlers come
    back after. Outside the main thread, or nested in another ``handling``, it changes nothing."""
    if _STATE.active or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handle) for s in SIGNALS}
    _STATE.active, _STATE.signum = True, None
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _STATE.active, _STATE.signum = False, None
