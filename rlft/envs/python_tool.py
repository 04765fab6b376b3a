r"""The ``python`` tool: the model's program runs in rlft's code sandbox, and the tool answers with what it printed.

``<call>python: print(sum(range(10)))</call>`` is answered ``<result>45</result>``. The program runs as
``__main__`` in one jailed process (:func:`rlft.rewards.sandbox.run_program`: bubblewrap, seccomp, rlimits, a
uid of its own, the wall-clock deadline ``timeout_s``; no files of the host, no network, no new processes; the
threat model is in ``rlft/rewards/sandbox.py``). Nothing persists between calls: each call is a fresh program.

The answer is the program's standard output (trailing newlines dropped; ``(no output)`` when it printed
nothing), followed when the program failed by a last line that says how::

    error: ZeroDivisionError: division by zero     the last line of its stderr (a traceback ends on the exception)
    error: exit status 3                           a failure that wrote nothing to stderr
    timed out after 3s                             the deadline; what it printed before still comes back
    stopped: wrote more than 65536 bytes           a limit the host watches

The whole answer has at most ``max_chars`` characters: the output is cut first (marked ``...[cut]``), so the
last line survives. Keep ``ToolEnv``'s own ``max_chars`` at least as large, or it cuts the last line away.
A sandbox that cannot start here (no bubblewrap, no user namespaces) is a :class:`ToolError` the model reads.

``timeout_s`` defaults to 3 s so that a call, jail start-up included, ends within the environment's default
step deadline (``env.deadline_s``, 5 s).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from rlft.envs.base import check_int
from rlft.envs.tools import CUT, MAX_CHARS, TOOLS, Tool, ToolError, clip

MAX_BYTES = 1 << 16  # of stdout and of stderr; past it the run is stopped
NO_OUTPUT = "(no output)"


@dataclass(frozen=True)
class RunPython:
    """The tool's function (a plain picklable object): ``RunPython(...)(code) -> str``. Marked slow: a
    ``ToolEnv`` with this tool steps in the reward pool's workers while a pool is active."""

    runs_in_pool = True  # a class attribute, not a field: the mark rlft.envs.tool_env reads

    timeout_s: float
    memory_mb: int
    max_chars: int

    def __call__(self, code: str) -> str:
        if not code.strip():
            raise ToolError("empty code: write a Python program that prints what you want to see")
        # rlft.rewards's package imports torch: imported here, `import rlft.envs` stays light
        from rlft.rewards.jail import warn_once
        from rlft.rewards.sandbox import JailUnavailable, Limits, run_program

        try:
            result = run_program(code, limits=Limits(timeout_s=self.timeout_s, memory_mb=self.memory_mb),
                                 max_bytes=MAX_BYTES)
        except JailUnavailable as e:
            warn_once(f"the python tool cannot run programs here: {e}")
            raise ToolError(f"python is unavailable: the sandbox cannot start here ({clip(str(e), 80)})") from None
        return answer(result.stdout, note(result.status, result.stderr, result.exit_code, result.reason),
                      self.max_chars)


def note(status: str, stderr: str, exit_code: int | None, reason: str) -> str:
    """The last line of an answer: how the program failed, or "" when it did not.

    >>> note("error", "Traceback ...\\n  1/0\\nZeroDivisionError: division by zero\\n", 1, "")
    'error: ZeroDivisionError: division by zero'
    >>> note("error", "", 3, ""), note("timeout", "", None, "timed out after 3s"), note("ok", "warn", 0, "")
    ('error: exit status 3', 'timed out after 3s', '')
    """
    if status == "ok":
        return ""
    if status == "error":
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        return f"error: {lines[-1] if lines else f'exit status {exit_code}'}"
    if status == "timeout":
        return reason
    return f"stopped: {reason}"


def answer(stdout: str, note: str, max_chars: int) -> str:
    """``stdout`` and the ``note`` line, together at most ``max_chars`` characters: the output is cut first.

    >>> answer("45\\n", "", 200), answer("", "", 200), answer("", "timed out after 3s", 200)
    ('45', '(no output)', 'timed out after 3s')
    >>> answer("0123456789" * 5, "error: E", 30)
    '0123456789012...[cut]\\nerror: E'
    """
    out = stdout.rstrip("\n")
    if not note:
        return (out if len(out) <= max_chars else out[:max_chars - len(CUT)] + CUT) or NO_OUTPUT
    note = clip(note, max_chars // 2)
    room = max_chars - len(note) - 1  # the newline before the note
    if len(out) > room:
        out = out[:max(room - len(CUT), 0)] + CUT
    return f"{out}\n{note}" if out else note


@TOOLS.register("python")
def python(timeout_s: float = 3.0, memory_mb: int = 512, max_chars: int = MAX_CHARS) -> Tool:
    """The python tool. ``timeout_s``: wall clock of one call (start-up included), from 0.1 to 600;
    ``memory_mb``: address space of the program's process, from 64 to 65536; ``max_chars``: the longest answer
    (at least 32), the failure's last line included."""
    run = RunPython(_seconds("timeout_s", timeout_s), check_int("memory_mb", memory_mb, low=64, high=65536),
                    check_int("max_chars", max_chars, low=32))
    return Tool("python", "Run a Python program (standard library only, no files or network, "
                f"{run.timeout_s:g} s at most) and read what it prints.",
                {"type": "object", "properties": {"code": {
                    "type": "string", "description": "a whole program; print the values you want to see"}},
                 "required": ["code"]}, run)


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a number of seconds, got {type(value).__name__} {value!r}")
    if not 0.1 <= value <= 600:
        raise ValueError(f"{name}: must be from 0.1 to 600 seconds, got {value}")
    return float(value)
