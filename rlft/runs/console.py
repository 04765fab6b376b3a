"""``run.log``: what the console showed of a run, kept in its directory.

:class:`RunLog` wraps the run's ``echo`` and listens to the ``rlft`` loggers' warnings (reward failures, the
carved held-out split, ...): every line goes to the console as before and, once the run directory exists
(``attach``), is appended to ``run.log`` with the lines shown before it. Progress bars write to the terminal
themselves and never reach it. A resumed run appends; the error or stop that ends a run is its last line.
"""

from __future__ import annotations

import contextvars
import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

from rlft.config import ConfigError
from rlft.data.schema import DataError
from rlft.errors import TrainingHalted
from rlft.runs.stop import StoppedNow

RUN_LOG = "run.log"


class RunLog:
    """A tee of a run's console into ``run.log``; a context manager (the logging handler is removed at exit)."""

    def __init__(self, echo: Callable = print):
        self._echo = echo
        self._pending: list[str] = []
        self._file: TextIO | None = None
        self._handler = _Warnings(self)

    def echo(self, *args, **kwargs) -> None:
        """The line to the console (the wrapped echo, called with exactly these arguments) and to run.log."""
        self._echo(*args, **kwargs)
        self.write(kwargs.get("sep", " ").join(map(str, args)) + kwargs.get("end", "\n"))

    def write(self, text: str) -> None:
        if self._file is None:
            self._pending.append(text)
            return
        try:
            self._file.write(text)
            self._file.flush()
        except OSError:  # a full disk: the run's own writes report it; the console copy stops
            self._close()

    def attach(self, run_dir: Path) -> None:
        """Start writing ``run_dir/run.log`` (appending), with the lines shown so far."""
        try:
            self._file = (Path(run_dir) / RUN_LOG).open("a", encoding="utf-8")
        except OSError:
            return
        pending, self._pending = self._pending, []
        self.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {command_line()}\n")
        for text in pending:
            self.write(text)

    def __enter__(self) -> "RunLog":
        rlft = logging.getLogger("rlft")
        self._handler.console = not (rlft.handlers or logging.getLogger().handlers)
        rlft.addHandler(self._handler)
        return self

    def __exit__(self, kind, err, tb) -> None:
        logging.getLogger("rlft").removeHandler(self._handler)
        if err is not None and self._file is not None:
            self.write(ending(err) + "\n")
        self._close()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


STARTED_BY: contextvars.ContextVar[str] = contextvars.ContextVar("rlft_started_by", default="")
"""How the run about to start was asked for, when a Python caller says (``rlft.train(recipe='r.yaml')``); the
``rlft`` command is read from ``sys.argv`` instead."""


def command_line(api: str = "rlft.train") -> str:
    """How this run was started, as run.log's first line and run.json record it: the ``rlft`` command as typed
    (``sys.argv``); else what :data:`STARTED_BY` holds; else a call of ``api`` from the Python program running."""
    argv = sys.argv if sys.argv and sys.argv[0] else []
    first = Path(argv[0]) if argv else Path()
    if first.name == "rlft":
        return shlex.join(["rlft", *argv[1:]])
    if first.name == "__main__.py" and first.parent.name == "rlft":
        return shlex.join(["python", "-m", "rlft", *argv[1:]])
    if STARTED_BY.get():
        return STARTED_BY.get()
    return f"{api}(...) in " + (f"python {shlex.join(argv)}" if argv else "an interactive Python session")


def ending(err: BaseException) -> str:
    """The line ``rlft`` ends a failed command with (rlft.cli.main prints it; run.log ends with it)."""
    if isinstance(err, TrainingHalted):
        return f"rlft: stopped: {err}"
    if isinstance(err, (ConfigError, DataError, FileNotFoundError)):
        return f"rlft: error: {err}"
    if isinstance(err, StoppedNow):
        return ("rlft: stopped: Ctrl-C pressed again: stopped at once; what was being written was dropped whole, "
                "train.resume=true continues from the last checkpoint")
    if isinstance(err, KeyboardInterrupt):
        return "rlft: stopped: interrupted (Ctrl-C)"
    first = str(err).strip().splitlines()
    return f"rlft: failed: {type(err).__name__}: {first[0] if first else ''}"


class _Warnings(logging.Handler):
    """The ``rlft`` loggers' warnings into run.log, and to stderr as Python prints them when no handler is
    configured (``console``: adding this handler would otherwise silence them there)."""

    def __init__(self, log: RunLog):
        super().__init__(logging.WARNING)
        self.log, self.console = log, True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.console and logging.lastResort is not None:
                logging.lastResort.handle(record)
            self.log.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001  logging's own rule: a handler's failure is reported, never raised
            self.handleError(record)
