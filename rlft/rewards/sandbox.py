"""Run an untrusted Python program against trusted tests in a separate, contained process.

:func:`run` starts ``python -I -S harness.py`` (``rlft/rewards/harness.py``, run
as a script: the *harness*, standard library only). Processes, outermost first:

- **host**: the caller (a reward, often in a ``RewardPool`` worker). It holds the
  wall clock, reads the verdict and kills the harness's session on timeout.
- **H** (root or the caller's user): a new session, ``PR_SET_PDEATHSIG=SIGKILL``
  (dies with the host's thread), then ``unshare`` of new PID, network and mount
  namespaces, then ``fork``.
- **C**, PID 1 of the new PID namespace: mounts a fresh ``/proc`` and small
  ``tmpfs`` over the world-writable directories (``/tmp``, ``/var/tmp``,
  ``/dev/shm``, ``/run/lock``), makes ``/tmp/work`` its working directory, sets
  rlimits (CPU seconds, address space, file size, processes, open files, no core
  files), drops to ``nobody`` (65534) when root, sets ``PR_SET_NO_NEW_PRIVS``
  and re-arms ``PR_SET_PDEATHSIG``; then loads the tests (HumanEval's ``check``
  is defined, MBPP's asserts compiled) *before* the program runs, installs the
  runtime guards and runs the program, then each test.

The verdict: after each test returns normally, C writes ``<nonce> pass <i>`` to
a pipe only the host reads; the nonce is a fresh random per run, sent on stdin.
Exit status and stdout are ignored; a run counts only the pass lines that carry
the nonce, and only tests the harness itself announced.

What this protects against (each is in ``tests/hostile/``):

- hangs and busy loops (wall clock, RLIMIT_CPU); memory bombs (RLIMIT_AS); huge
  files (RLIMIT_FSIZE, and the size of the tmpfs); fork bombs (RLIMIT_NPROC as an
  unprivileged user); processes left behind, including ones that call
  ``setsid`` or detach: C is PID 1 of its namespace, so when C dies the kernel
  kills every process in it, and C dies with H, which dies with the host
  (``PDEATHSIG``) or on timeout (the host kills H's session);
- writing or deleting host files (``nobody`` owns nothing; the writable
  directories are fresh tmpfs mounts that vanish with the namespace); reading the
  parent's environment (the environment is empty); the network (a new network
  namespace has only a down loopback); signalling host processes (none is
  visible in the PID namespace, and ``nobody`` may not signal root's);
- forged verdicts: ``os._exit(0)``, ``SystemExit``, ``sys.exit``, redefining
  ``exit`` or ``AssertionError``, printing a success marker, killing the parent,
  patching the harness's module globals or the builtins its loop uses
  (``builtins.enumerate``, ``BaseException``: the harness runs on locals bound
  before the program), patching or shadowing builtins that HumanEval's ``check``
  uses (it gets a copy of builtins taken before the program, and the program's
  names that shadow a builtin are not copied into its module), exceptions whose
  ``__str__``/``__del__`` run code while reported, invalid UTF-8 or floods on the
  report pipe, tracers (``sys.settrace``/``sys.setprofile`` are reset before each
  test and removed from ``sys``);
- reaching the harness's frames or memory by names computed at run time, where
  Python audits it: an audit hook (which the program cannot remove) refuses
  ``ctypes`` calls that load libraries or wrap addresses (``CDLL``,
  ``from_address``, ``string_at``: ctypes stays loaded in the harness and its
  classes are reachable through ``object.__subclasses__()``), ``gc``'s object
  walks, ``tb_frame``/``gi_frame``/``cr_frame``/``ag_frame``, ``sys._getframe``,
  ``sys._current_frames``, new code objects (``CodeType``, ``code.replace``) and
  further audit hooks;
- forbidden modules and builtins named in the job, at run time: a meta-path
  finder refuses them (``import``, ``__import__``, ``importlib.import_module``),
  they are dropped from ``sys.modules``, and forbidden builtins are deleted from
  ``builtins`` (so ``getattr(builtins, 'ev' + 'al')`` fails). ``rlft.rewards.code``
  checks the names statically as well.

What it does **not** protect against:

- a program that reads the nonce (or calls the harness's ``report``) from its own
  process by routes Python does not audit can forge pass lines: a signal handler
  receives the running frame (``signal.signal`` + ``setitimer``, then
  ``f_back``/``f_locals`` named at run time); ctypes' unaudited parts, reached
  through ``object.__subclasses__()`` and names computed at run time
  (``memmove`` from ``CDLL.__init__`` 's globals, a ``_SimpleCData`` subclass
  built on an address) read the whole address space (``/proc/self/maps`` is
  readable); crafted bytecode from ``marshal.loads`` (imports need it, so it is
  not refused); ``/proc/self/mem`` where the program keeps its uid (it is
  non-dumpable after the drop to ``nobody``). The code reward refuses the names
  that lead there (``INTROSPECTION`` in ``rlft.rewards.code``); what is computed
  at run time past that and the audit hook is not caught (the known holes are
  ``KNOWN_HOLES`` in ``tests/test_sandbox.py``);
- objects that compare equal to everything (``__eq__`` returning True) pass
  ``assert f(x) == y`` tests; MBPP's asserts run in the program's namespace, so
  the program may redefine or patch any name they use (``def sorted``,
  ``builtins.set``), and any test may be fooled by patched modules it uses
  (``math.isclose = lambda *a, **k: True``); a tracer installed *inside* the
  candidate function can still alter the test's frame while it runs;
- CPU or memory pressure on the host: limits are per process (total memory is
  bounded by ``max_procs * memory_mb``), not a cgroup; reading world-readable
  host files (the filesystem is not hidden, only made unwritable);
- without namespaces (not root, or ``unshare`` refused: a warning is logged once)
  there is no network isolation, and a process that calls ``setsid`` and ignores
  the kill of its group can outlive the run; not root: no privilege drop, so
  ``RLIMIT_NPROC`` counts all of the user's processes. As root without
  namespaces the program drops to ``nobody`` only when ``nobody`` can read the
  interpreter; an interpreter in a private directory (``/root/.pyenv``) keeps
  root's uid, so files and fork bombs are bounded by rlimits and the wall
  clock alone (a warning says so).
"""

from __future__ import annotations

import logging
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from rlft.rewards import harness
from rlft.rewards.harness import NOBODY, others_can_read

logger = logging.getLogger("rlft.rewards")
MAX_REPORT_BYTES = 1 << 20
KILL_GRACE_S = 5.0
_warned: set[str] = set()


@dataclass(frozen=True)
class Limits:
    """What one run may use. ``timeout_s`` is wall clock for everything: start, program and all tests."""

    timeout_s: float = 5.0
    memory_mb: int = 512  # address space of each process
    file_mb: int = 16  # largest file; the tmpfs mounts hold 4x this
    max_procs: int = 16  # processes (and threads) of the sandbox user

    def as_job(self) -> dict:
        return {"cpu_s": int(self.timeout_s) + 1, "memory_mb": self.memory_mb, "file_mb": self.file_mb,
                "max_procs": self.max_procs}


@dataclass
class RunResult:
    """``status``: ok (every test ran), error (the program raised), timeout, crashed (ended without finishing)."""

    status: str
    n_tests: int
    passed: frozenset[int] = field(default_factory=frozenset)
    reason: str = ""


def run(program: str, *, check_module: str | None = None, entry_point: str | None = None,
        asserts: tuple[str, ...] = (), setup: str = "", forbidden: tuple[str, ...] = (),
        limits: Limits = Limits(), namespaces: bool = True) -> RunResult:
    """Run ``program`` then its tests in a contained process; which tests passed comes from the harness.

    ``check_module`` (HumanEval) defines ``check(candidate)``, called on the program's ``entry_point``;
    each of ``asserts`` (MBPP) is run in the program's namespace, after the program and then ``setup``
    (MBPP's fixtures build objects of the program's classes). ``namespaces=False`` runs the fallback
    that a platform refusing ``unshare`` gets (tests use it).

    >>> r = run("def add(a, b):\\n    return a + b", asserts=("assert add(1, 2) == 3", "assert add(1, 1) == 3"))
    >>> r.status, r.n_tests, sorted(r.passed)
    ('ok', 2, [0])
    """
    n_tests = (1 if check_module else 0) + len(asserts)
    root = os.getuid() == 0
    # With namespaces the work directory is a tmpfs that vanishes with them; the host makes one only
    # without (not root), and H makes it if unshare fails. A run killed with its pool worker leaves nothing.
    workdir = os.path.join(tempfile.gettempdir(), f"rlft-sandbox-{secrets.token_hex(8)}")
    try:
        if not (root and namespaces):
            os.mkdir(workdir, 0o700)
            if root and others_can_read(sys.base_prefix):
                os.chown(workdir, NOBODY, NOBODY)
        job = {"program": program, "check_module": check_module or "", "entry_point": entry_point or "",
               "asserts": list(asserts), "setup": setup, "forbidden": list(forbidden), "limits": limits.as_job(),
               "uid": NOBODY, "workdir": workdir, "namespaces": root and namespaces, "nonce": secrets.token_hex(16)}
        if not root:
            _warn_once("not root: no namespaces and no privilege drop (network and setsid escapes are possible)")
        out, timed_out = _execute(job, limits.timeout_s)
        return _parse(job["nonce"], out, n_tests, timed_out, limits.timeout_s)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _execute(job: dict, timeout_s: float) -> tuple[bytes, bool]:
    """Start the harness, feed it the job, collect its report; kill its session at the deadline."""
    import marshal

    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(harness.__file__), str(write_end),
                                 str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env={}, cwd="/", pass_fds=(write_end,),
                                start_new_session=True)
    finally:
        os.close(write_end)
    deadline = time.monotonic() + timeout_s
    try:
        try:
            proc.stdin.write(marshal.dumps(job))
            proc.stdin.close()
        except BrokenPipeError:  # the harness is already gone: no report, a crash
            pass
        out, complete = _read(read_end, deadline)
        timed_out = not (complete and _exited(proc.pid, deadline))
    finally:
        _kill_session(proc)
        _read(read_end, time.monotonic() + KILL_GRACE_S)  # EOF once every process holding the pipe is gone
        os.close(read_end)
    return out, timed_out


def _read(fd: int, deadline: float) -> tuple[bytes, bool]:
    """What ``fd`` yields until EOF (True) or the deadline (False); at most MAX_REPORT_BYTES are kept."""
    chunks, size = [], 0
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return b"".join(chunks), False
            data = os.read(fd, 65536)
            if not data:
                return b"".join(chunks), True
            if size < MAX_REPORT_BYTES:
                chunks.append(data)
                size += len(data)


def _exited(pid: int, deadline: float) -> bool:
    """Wait (without reaping, so the process group stays ours) until ``pid`` exits or the deadline."""
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # H is unreaped, so its group id cannot have been reused
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _parse(nonce: str, out: bytes, n_tests: int, timed_out: bool, timeout_s: float) -> RunResult:
    passed, first_fail, error, done = set(), "", "", False
    prefix = nonce + " "
    for line in out.decode("utf-8", "replace").splitlines():
        if not line.startswith(prefix):
            continue
        kind, _, rest = line[len(prefix):].partition(" ")
        if kind == "pass" and rest.isdigit() and int(rest) < n_tests:
            passed.add(int(rest))
        elif kind == "fail":
            first_fail = first_fail or rest.partition(" ")[2]
        elif kind == "error":
            error = error or rest
        elif kind == "warn":
            _warn_once(rest)
        elif kind == "done":
            done = True
    if error:
        status, reason = "error", error
    elif done:
        status, reason = "ok", first_fail
    elif timed_out:
        status, reason = "timeout", f"timed out after {timeout_s:g}s"
    else:
        status, reason = "crashed", "ended before finishing the tests"
    return RunResult(status=status, n_tests=n_tests, passed=frozenset(passed), reason=reason)


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning("code sandbox: %s", message)
