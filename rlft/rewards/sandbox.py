"""Run an untrusted program against a task's tests: two jailed processes, plain data between them, the verdict apart.

Threat model (also in ``docs/reference/rewards.md``).

**Protected**: the host (its files, processes, network, memory and time), the
other samples scored at the same time, and the verdict. **Against**: any
program, including one written to attack this harness, and the task's own test
code (dataset code is not trusted either).

**How** (each promise and what keeps it):

- *The verdict never shares a process with the program.* :func:`run` starts two
  processes per sample (``rlft/rewards/jailed/``): **P** runs the program and
  answers calls; **T** builds the tests' namespace from the task alone (HumanEval's
  prompt and ``check``, MBPP's setup and asserts), calls the program's functions
  through a channel that carries plain data (``jailed/wire.py``: built-in values,
  rebuilt on T's side from JSON, never unpickled), compares the answers itself and
  writes the verdict to a pipe that only the host reads. Nothing the program does
  to its own interpreter (tracers, frames, native calls, planted modules, magic
  methods, a rewritten harness) reaches T: P's answers are bytes, and T builds
  genuine ``int``/``list``/... objects from them. A value that cannot cross fails
  its test and is counted (``n_not_plain``). Enforced by the kernel's process
  separation plus the PID namespaces below (P cannot see, signal or trace T).
- *A real jail* (``rlft.rewards.jail``): bubblewrap gives each process new user,
  PID, mount, network, IPC, UTS and cgroup namespaces and a read-only root with
  only the interpreter (no ``site-packages``, no ``ctypes``) and system
  libraries; a seccomp filter refuses new processes, tracing, other processes'
  memory, ``memfd_create``, SysV/POSIX IPC, keys, BPF, mounts, namespace changes,
  sockets other than ``AF_UNIX`` and the ``prctl`` options that undo
  protections. As root, each sample runs as host uids of its own.
- *Per-sample limits*: address space (``memory_mb`` per process, and the
  program cannot make a second process, so its memory is bounded), threads
  (``RLIMIT_NPROC`` on the sample's own uid), CPU seconds (``RLIMIT_CPU``),
  file size and a tmpfs of ``4 * file_mb``; the wall clock (``timeout_s``) is
  the host's: at the deadline it kills each namespace's PID 1 (the kernel then
  kills everything in it) and reaps bwrap.

*A plain program* (:func:`run_program`, for tools such as ``rlft.envs``'s
``python``): one process (``jailed/main.py``) in the same jail, with the same
limits, seccomp filter and uid of its own; its standard output and error come
back through two pipes, at most ``max_bytes`` each (past that, the host stops
the run), with its exit status. There is no verdict to protect here: what it
prints and how it exits are the program's to choose, and callers treat them as
untrusted text.

**Not protected** (say it): the CPU and memory a sample spends within its
limits are taken from the host and from concurrent samples (no cgroup: up to
``max_procs`` threads may run on every core until the deadline); the kernel
itself (a kernel bug reachable through the allowed system calls escapes any
namespace jail; gVisor would be the next step); as a non-root user the thread
limit counts all of that user's processes; a test that needs objects plain
data cannot carry (MBPP's tree fixtures built from the program's class) fails;
``reward.sandbox=unjailed`` keeps only the two processes and rlimits (no
namespaces, no seccomp, no uid of its own: the program can read the host's files
and use its network), and a warning says so.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from dataclasses import dataclass, field

from rlft.rewards.bindings import bindings, defined_names
from rlft.rewards.jail import MODES, JailUnavailable, Jailed, Limits, Slot, files_in_tmp, start, stop, warn_once
from rlft.rewards.jailed import wire

__all__ = ["MODES", "JailUnavailable", "Limits", "ProgramResult", "RunResult", "run", "run_program"]
MAX_REPORT_BYTES = 1 << 20
WATCH_S = 0.05  # how often the host counts the files in each jail's /tmp


@dataclass
class RunResult:
    """``status``: ok (every test ran), error (the program or the tests raised before the tests), timeout,
    crashed (ended without finishing), limit (stopped by the host for a limit it watches: files in /tmp).
    ``not_plain``: tests failed by a value that cannot cross."""

    status: str
    n_tests: int
    passed: frozenset[int] = field(default_factory=frozenset)
    reason: str = ""
    not_plain: int = 0


def run(program: str, *, check_module: str | None = None, entry_point: str | None = None,
        asserts: tuple[str, ...] = (), setup: str = "", prompt: str = "", limits: Limits = Limits(),
        mode: str = "jail") -> RunResult:
    """Run ``program`` in one jailed process and its tests in another; which tests passed comes from the tests'.

    ``check_module`` (HumanEval) defines ``check(candidate)``, called on a proxy of the program's
    ``entry_point``, after ``prompt`` (its imports and helpers) ran on the tests' side; each of
    ``asserts`` (MBPP) runs on the tests' side after ``setup``, with the program's functions as proxies.

    >>> r = run("def add(a, b):\\n    return a + b", asserts=("assert add(1, 2) == 3", "assert add(1, 1) == 3"))
    >>> r.status, r.n_tests, sorted(r.passed)
    ('ok', 2, [0])
    """
    n_tests = (1 if check_module else 0) + len(asserts)
    deadline = time.monotonic() + limits.timeout_s
    base = {"limits": limits.as_job(), "drop": _drops(mode)}
    p_job = {**base, "program": program}
    t_job = {**base, "check_module": check_module or "", "entry_point": entry_point or "", "prompt": prompt,
             "asserts": list(asserts), "setup": setup, "n_tests": n_tests,
             "bindings": _bindings(setup, tuple(asserts), prompt, check_module or "")}
    out, complete = _execute(p_job, t_job, limits, mode, deadline)
    return _parse(out, n_tests, timed_out=not complete, timeout_s=limits.timeout_s)


def _drops(mode: str) -> bool:
    """Whether the jailed scripts become the run's own uid (as root in a jail); a warning once when they cannot."""
    drop = mode == "jail" and os.geteuid() == 0
    if mode == "jail" and not drop:
        warn_once("not root: every sample runs as this user, so the thread limit (max_procs) counts all of "
                  "the user's processes")
    return drop


def _bindings(setup: str, asserts: tuple[str, ...], prompt: str, check_module: str) -> list:
    """Where the tests' free names come from (``rlft.rewards.bindings``); none for tests that do not parse."""
    if not asserts:
        return []
    try:
        return bindings(setup, asserts, defined_names(prompt, check_module))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []


def _execute(p_job: dict, t_job: dict, limits: Limits, mode: str, deadline: float) -> tuple[bytes, bool]:
    """Start P and T joined by two pipes, give each its job, read T's report until EOF or the deadline."""
    slot = Slot()
    to_t_r, to_t_w = os.pipe()
    to_p_r, to_p_w = os.pipe()
    report_r, report_w = os.pipe()
    started: list[Jailed] = []
    try:
        started.append(start("program.py", [str(to_p_r), str(to_t_w)], (to_p_r, to_t_w), limits, mode,
                             slot.uid(0), deadline))
        started.append(start("tests.py", [str(to_t_r), str(to_p_w), str(report_w)], (to_t_r, to_p_w, report_w),
                             limits, mode, slot.uid(1), deadline))
        for fd in (to_t_r, to_t_w, to_p_r, to_p_w, report_w):
            os.close(fd)
        to_t_r = to_t_w = to_p_r = to_p_w = report_w = -1
        for jailed, job in zip(started, (p_job, t_job)):
            _give(jailed, job)
        return _read(report_r, deadline, lambda: _over_limits(started, limits))
    finally:
        stop(*started)
        for jailed in started:
            for stream in (jailed.proc.stdin, jailed.proc.stderr):
                if stream is not None:
                    stream.close()
        for fd in (to_t_r, to_t_w, to_p_r, to_p_w, report_w, report_r):
            if fd >= 0:
                os.close(fd)
        slot.release()


def _give(jailed: Jailed, job: dict) -> None:
    try:
        jailed.proc.stdin.write(wire.encode(job))
        jailed.proc.stdin.close()
    except (BrokenPipeError, OSError):  # the process is gone already: no report, a crash
        pass


def _over_limits(started: list[Jailed], limits: Limits) -> str:
    """Why the run must stop now, or "": a jail's /tmp holds more than ``max_files`` files (no tmpfs option
    that bwrap sets bounds them, and each costs kernel memory)."""
    for jailed in started:
        if files_in_tmp(jailed, limits) > limits.max_files:
            return f"limit made more than {limits.max_files} files in /tmp"
    return ""


def _read(fd: int, deadline: float, over_limits=lambda: "") -> tuple[bytes, bool]:
    """What ``fd`` yields until EOF (True) or the deadline (False); at most MAX_REPORT_BYTES are kept. Every
    ``WATCH_S`` it asks ``over_limits``; a reason ends the read (False) with the reason as a last line."""
    chunks, size = [], 0
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return b"".join(chunks), False
            if not sel.select(min(left, WATCH_S)):
                reason = over_limits()
                if reason:
                    return b"".join(chunks) + b"\n" + reason.encode() + b"\n", False
                continue
            data = os.read(fd, 65536)
            if not data:
                return b"".join(chunks), True
            if size < MAX_REPORT_BYTES:
                chunks.append(data)
                size += len(data)


def _parse(out: bytes, n_tests: int, timed_out: bool, timeout_s: float) -> RunResult:
    """The verdict from T's report. A test passes only when its one result line says so."""
    results: dict[int, list[str]] = {}
    error, crash, limit, done, announced = "", "", "", False, None
    for line in out.decode("utf-8", "replace").split("\n"):  # only T's own newline ends a line
        kind, _, rest = line.partition(" ")
        if kind in ("pass", "fail"):
            index, _, why = rest.partition(" ")
            if index.isascii() and index.isdigit() and int(index) < n_tests:
                results.setdefault(int(index), []).append(kind if kind == "pass" else why)
        elif kind == "tests":
            announced = rest
        elif kind == "error":
            error = error or rest
        elif kind == "crash":
            crash = crash or rest
        elif kind == "done":
            done = True
        elif kind == "limit":
            limit = limit or rest
    passed = frozenset(i for i, r in results.items() if r == ["pass"])
    fails = [w for r in results.values() for w in r if w != "pass"]
    first_fail = next(iter(fails), "")
    not_plain = sum(w.startswith(wire.NOT_PLAIN) for w in fails)
    if limit:  # the host's own line (T's lines never start with "limit"): the run was stopped, nothing passes
        status, reason, passed = "limit", limit, frozenset()
    elif announced != str(n_tests) and not timed_out:
        status, reason, passed = "crashed", "the tests' process did not start", frozenset()
    elif error:
        status, reason = "error", error
    elif crash:
        status, reason = "crashed", crash
    elif done:
        status, reason = "ok", first_fail
    elif timed_out:
        status, reason = "timeout", f"timed out after {timeout_s:g}s"
    else:
        status, reason = "crashed", "ended before finishing the tests"
    return RunResult(status=status, n_tests=n_tests, passed=passed, reason=reason, not_plain=not_plain)


# ---- a plain program: its output and exit status ----------------------------------------------------------


@dataclass(frozen=True)
class ProgramResult:
    """What :func:`run_program` saw. ``status``: ok (exit status 0), error (another exit status), timeout, limit
    (stopped by the host: output past ``max_bytes``, too many files in /tmp); ``stdout`` and ``stderr``: what the
    program wrote (at most ``max_bytes`` of each, decoded as UTF-8 with replacement); ``exit_code``: its exit
    status when it ended by itself (killed by signal N: 128 + N in a jail, -N unjailed), else None; ``reason``:
    one line (the timeout, the limit), empty for ok and error."""

    status: str
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    reason: str = ""


def run_program(program: str, *, limits: Limits = Limits(), max_bytes: int = 1 << 16,
                mode: str = "jail") -> ProgramResult:
    """Run ``program`` as ``__main__`` in one jailed process, stdin empty; its output and exit status.

    The same jail, limits and uid of its own as :func:`run`; ``limits.timeout_s`` bounds everything, start-up
    included. A :class:`JailUnavailable` when the jail cannot start here.

    >>> r = run_program("print(6 * 7)\\nraise SystemExit(3)")
    >>> r.status, r.stdout, r.exit_code
    ('error', '42\\n', 3)
    """
    deadline = time.monotonic() + limits.timeout_s
    job = {"limits": limits.as_job(), "drop": _drops(mode), "program": program}
    slot = Slot()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    jailed = None
    try:
        jailed = start("main.py", [str(out_w), str(err_w)], (out_w, err_w), limits, mode, slot.uid(0), deadline)
        os.close(out_w)
        os.close(err_w)
        out_w = err_w = -1
        _give(jailed, job)
        (out, err), status, reason = _read_streams(  # _over_limits's reason is a report line: "limit ..."
            (out_r, err_r), deadline, max_bytes, lambda: _over_limits([jailed], limits).removeprefix("limit "))
        exit_code = None
        if not status and mode == "jail" and jailed.init_pid is None:  # the deadline passed while bwrap started
            status = "timeout"
        if not status:
            try:
                exit_code = jailed.proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:  # it closed its output and goes on
                status = "timeout"
        if status == "timeout":
            reason = f"timed out after {limits.timeout_s:g}s"
    finally:
        if jailed is not None:
            stop(jailed)
            for stream in (jailed.proc.stdin, jailed.proc.stderr):
                if stream is not None:
                    stream.close()
        for fd in (out_r, out_w, err_r, err_w):
            if fd >= 0:
                os.close(fd)
        slot.release()
    if not status:
        status = "ok" if exit_code == 0 else "error"
    text = [b.decode("utf-8", "replace") for b in (out, err)]
    return ProgramResult(status, text[0], text[1], exit_code, reason)


def _read_streams(fds: tuple[int, ...], deadline: float, max_bytes: int,
                  over_limits=lambda: "") -> tuple[list[bytes], str, str]:
    """What each of ``fds`` yields, and ``("", "")`` once all reached EOF, else why the read stopped: ``("timeout",
    "")`` at the deadline, ``("limit", reason)`` when one passed ``max_bytes`` (each keeps its first ``max_bytes``)
    or ``over_limits`` (asked every ``WATCH_S``) gave a reason."""
    chunks: dict[int, list[bytes]] = {fd: [] for fd in fds}
    sizes = dict.fromkeys(fds, 0)

    def kept() -> list[bytes]:
        return [b"".join(chunks[fd])[:max_bytes] for fd in fds]

    watch = time.monotonic() + WATCH_S
    with selectors.DefaultSelector() as sel:
        for fd in fds:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                return kept(), "timeout", ""
            if now >= watch:
                watch = now + WATCH_S
                reason = over_limits()
                if reason:
                    return kept(), "limit", reason
            for key, _ in sel.select(min(deadline, watch) - now):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fd)
                    continue
                chunks[key.fd].append(data)
                sizes[key.fd] += len(data)
                if sizes[key.fd] > max_bytes:
                    return kept(), "limit", f"wrote more than {max_bytes} bytes"
    return kept(), "", ""
