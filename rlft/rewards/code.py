"""The ``code`` reward: run the completion's program against the task's tests in a sandbox.

The program is the last fenced block of the completion (```` ```python ... ``` ````,
any language tag or none), else the raw completion. It runs in a jailed process
and the task's tests in another (``rlft.rewards.sandbox``, whose docstring is the
threat model); the sample is scored by the fraction of tests that returned
normally (``mode="fraction"``) or 1.0 only when all did (``"pass"``).

Two kinds of task, found in the sample (see :func:`task_fields`):

- **HumanEval**: ``test`` defines ``check(candidate)``, called on ``entry_point``
  (one test). The completion is either a full function (it defines
  ``entry_point``: it runs after the task's prompt, which brings the imports and
  helpers, and its own definition wins) or a body continuing the prompt (the
  program is prompt + completion). The prompt is ``code_prompt`` in the fields,
  else ``sample["prompt"]`` when it is plain text. The tests' side runs the
  prompt too, so ``check`` uses the prompt's helpers, never the program's.
- **MBPP**: ``test_list`` is a list of ``assert`` lines (one test each), run
  after ``test_setup_code`` on the tests' side, with the program's functions
  called through the channel.

The fields are read from ``sample["extra"]["extra_info"]`` (verl layout, what
``rlft prepare humaneval|mbpp`` writes), else ``sample["extra"]`` (a plain row:
unconsumed fields land there), else the sample itself. A sample without tests
is unscorable (``None``).

``forbidden`` names modules and builtins a task bans: policy, checked on the
program's text before it runs (``rlft.rewards.static``, with a budget); a program
that uses one is not passing (status ``forbidden``). What a ban is *for* (no
network, no new processes, no writes outside the sample's tmpfs) the jail refuses
by kernel rule whatever the program's names.

Evaluation (``eval.correct_fn=code``) counts a value >= 1 as correct, which in
either mode means every test passed; ``code_pass`` is the same reward with
``mode="pass"`` (a binary training signal).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from rlft.rewards.base import REWARDS, check_choices
from rlft.rewards.bindings import parse
from rlft.rewards.pool import runs_in_pool
from rlft.rewards.sandbox import MODES, JailUnavailable, Limits, RunResult, run
from rlft.rewards.static import static_problem

_FENCE = re.compile(r"^[ \t]*```[^\n`]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
_OPEN = re.compile(r"^[ \t]*```[^\n`]*\n", re.MULTILINE)


def extract_code(completion: str) -> str:
    """The last fenced code block of ``completion``; else what follows an unclosed fence (a generation cut
    short); else the whole completion.

    >>> extract_code("Here:\\n```python\\ndef f():\\n    return 1\\n```\\nand\\n```\\nx = 2\\n```\\n")
    'x = 2\\n'
    >>> extract_code("    return a + b\\n"), extract_code("```python\\nx = 1\\ny =")
    ('    return a + b\\n', 'x = 1\\ny =')
    """
    blocks = _FENCE.findall(completion)
    if blocks:
        return blocks[-1]
    opening = None
    for opening in _OPEN.finditer(completion):
        pass
    return completion[opening.end():] if opening else completion


def defines(tree: ast.Module, name: str) -> bool:
    """Whether the module defines function or class ``name`` at top level."""
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
               for n in tree.body)


def humaneval_program(prompt: str, completion: str, entry_point: str) -> str:
    """The program for a HumanEval task: the prompt, then a full function from the completion; else the
    prompt continued by the completion (a body).

    >>> humaneval_program("import math\\ndef f(x):\\n    '''doc'''\\n", "    return x\\n", "f")
    "import math\\ndef f(x):\\n    '''doc'''\\n    return x\\n"
    >>> humaneval_program("def f(x):\\n    '''doc'''\\n", "```python\\ndef f(x):\\n    return 2\\n```", "f")
    "def f(x):\\n    '''doc'''\\n\\ndef f(x):\\n    return 2\\n"
    """
    code = extract_code(completion)
    try:
        full = defines(parse(code), entry_point)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        full = False
    if full:
        return prompt.rstrip("\n") + "\n\n" + code if prompt else code
    return prompt + code


def score(prompt: str, completion: str, test: str, entry_point: str, timeout_s: float,
          forbidden: list[str], sandbox: str = "jail") -> dict:
    """Run a HumanEval-style completion against ``test`` (which defines ``check(candidate)``).

    Returns ``passed`` (every test passed), ``fraction``, ``n_tests``, ``n_passed``, ``status`` (ok,
    error, timeout, crashed, limit, syntax_error, forbidden), ``reason`` and ``n_not_plain`` (tests failed by a
    value that cannot cross between the program's process and the tests').

    >>> score("def add(a, b):\\n", "    return a + b\\n", "def check(f):\\n    assert f(2, 3) == 5\\n", "add", 5.0, [])
    {'passed': True, 'fraction': 1.0, 'n_tests': 1, 'n_passed': 1, 'status': 'ok', 'reason': '', 'n_not_plain': 0}
    """
    program = humaneval_program(prompt, completion, entry_point)
    return run_tests(program, check_module=test, entry_point=entry_point, prompt=prompt, forbidden=forbidden,
                     limits=Limits(timeout_s=timeout_s), sandbox=sandbox)


def run_tests(program: str, *, check_module: str | None = None, entry_point: str | None = None,
              asserts: tuple[str, ...] = (), setup: str = "", prompt: str = "", forbidden: Iterable[str] = (),
              limits: Limits = Limits(), sandbox: str = "jail") -> dict:
    """Check ``program`` statically (syntax, forbidden names), then run it with its tests in the sandbox."""
    n_tests = (1 if check_module else 0) + len(asserts)
    forbidden = tuple(forbidden)
    problem = static_problem(program, forbidden)
    if problem is not None:
        return _verdict(RunResult(status=problem[0], n_tests=n_tests, reason=problem[1]))
    return _verdict(run(program, check_module=check_module, entry_point=entry_point, asserts=tuple(asserts),
                        setup=setup, prompt=prompt, limits=limits, mode=sandbox))


def _verdict(result: RunResult) -> dict:
    n_passed = len(result.passed)
    fraction = n_passed / result.n_tests if result.n_tests else 0.0
    return {"passed": result.n_tests > 0 and n_passed == result.n_tests, "fraction": fraction,
            "n_tests": result.n_tests, "n_passed": n_passed, "status": result.status, "reason": result.reason,
            "n_not_plain": result.not_plain}


def task_fields(sample: Mapping) -> dict:
    """The task's fields, looked up in ``extra.extra_info`` (verl layout), then ``extra``, then the sample.

    >>> task_fields({"prompt": "q", "extra": {"extra_info": {"test_list": ["assert f() == 1"]}}})["test_list"]
    ['assert f() == 1']
    """
    extra = sample.get("extra") if isinstance(sample.get("extra"), Mapping) else {}
    info = extra.get("extra_info") if isinstance(extra.get("extra_info"), Mapping) else {}
    keys = ("test", "entry_point", "test_list", "test_setup_code", "code_prompt")
    out = {}
    for key in keys:
        for place in (info, extra, sample):
            if place.get(key) is not None:
                out[key] = place[key]
                break
    if "code_prompt" not in out and isinstance(sample.get("prompt"), str):
        out["code_prompt"] = sample["prompt"]
    return out


@REWARDS.register("code")
@runs_in_pool
@dataclass(frozen=True)
class Code:
    """Fraction of the task's tests the completion's program passes (or 1.0/0.0 with ``mode="pass"``).

    >>> Code()("```python\\ndef sq(x):\\n    return x * x\\n```", {"extra": {"test_list": ["assert sq(3) == 9"]}})
    1.0
    >>> Code()("anything", {"extra": {}}) is None
    True
    """

    timeout_s: float = 5.0
    """Wall-clock limit of one run (interpreter start, program and all tests); past it the sample scores 0."""
    mode: Literal["fraction", "pass"] = "fraction"
    """'fraction': share of tests passed; 'pass': 1.0 only when all pass."""
    forbidden: tuple[str, ...] = ()
    """Modules and builtins the task bans (matched as whole names); a program using one scores 0."""
    memory_mb: int = 512
    """Address-space limit of the program's process (and of the tests'), in MiB."""
    max_procs: int = 16
    """Threads the program's process may have (it may not start processes)."""
    file_mb: int = 16
    """Largest file the program may write, in MiB (its tmpfs holds 4x this)."""
    sandbox: str = "jail"
    """'jail' (bubblewrap + seccomp, per-sample uid and limits) or 'unjailed' (plain processes with rlimits:
    weaker, logged); usually set for every code reward at once by reward.sandbox."""

    def __post_init__(self) -> None:
        if not 0 < self.timeout_s <= 600:
            raise ValueError(f"timeout_s: must be in (0, 600], got {self.timeout_s}")
        check_choices(self)
        for name in ("memory_mb", "max_procs", "file_mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.sandbox not in MODES:
            raise ValueError(f"sandbox: must be one of {', '.join(MODES)}, got {self.sandbox!r}")
        if not all(isinstance(f, str) and f for f in self.forbidden):
            raise ValueError(f"forbidden: must be non-empty names, got {self.forbidden!r}")

    @property
    def deadline_s(self) -> float:
        """The pool's deadline: well past the sandbox's own timeout, so a hang scores 0.0 rather than None."""
        return 2 * self.timeout_s + 10.0

    def preflight(self) -> None:
        """Raise :class:`~rlft.rewards.jail.JailUnavailable`, saying what to install, where this reward's sandbox
        cannot run a correct program here (checked once per process and mode, before a run starts)."""
        _preflight(self.sandbox)

    def __call__(self, completion: str, sample: Mapping) -> float | None:
        result = self.check(completion, sample)
        if result is None:
            return None
        return result["fraction"] if self.mode == "fraction" else float(result["passed"])

    def check(self, completion: str, sample: Mapping) -> dict | None:
        """The full verdict (see :func:`score`), or None when the sample has no tests."""
        fields = task_fields(sample)
        limits = Limits(timeout_s=self.timeout_s, memory_mb=self.memory_mb, file_mb=self.file_mb,
                        max_procs=self.max_procs)
        asserts = tuple(_as_list(fields.get("test_list")))
        if fields.get("test") and fields.get("entry_point"):
            program = humaneval_program(fields.get("code_prompt") or "", completion, fields["entry_point"])
            return run_tests(program, check_module=fields["test"], entry_point=fields["entry_point"],
                             asserts=asserts, prompt=fields.get("code_prompt") or "", forbidden=self.forbidden,
                             limits=limits, sandbox=self.sandbox)
        if asserts:
            return run_tests(extract_code(completion), asserts=asserts, setup=fields.get("test_setup_code") or "",
                             forbidden=self.forbidden, limits=limits, sandbox=self.sandbox)
        return None


@functools.lru_cache(maxsize=None)
def _preflight(sandbox: str) -> None:
    result = run_tests("def f(x):\n    return x + 1\n", asserts=("assert f(1) == 2",), limits=Limits(timeout_s=30.0),
                       sandbox=sandbox)
    if not result["passed"]:
        raise JailUnavailable(f"the code sandbox ({sandbox}) did not pass a correct program here: {result['status']} "
                              f"({result['reason'] or 'no reason given'})")


def _as_list(value) -> list[str]:
    if value is None:
        return []
    if hasattr(value, "tolist"):  # numpy arrays from pandas
        value = value.tolist()
    if isinstance(value, str):
        return [value] if value.strip() else []
    return [v for v in value if isinstance(v, str) and v.strip()]


@REWARDS.register("code_pass")
@runs_in_pool
@dataclass(frozen=True)
class CodePass(Code):
    """1.0 when the completion's program passes every test of the task, else 0.0 (``code`` in pass mode)."""

    mode: Literal["fraction", "pass"] = "pass"
    """'fraction': share of tests passed; 'pass': 1.0 only when all pass."""
