"""Run an untrusted Python program against trusted tests in a separate, contained process.

:func:`run` starts ``python -I -S sandbox.py`` (this file, run as a script: the
*harness*, standard library only). Processes, outermost first:

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

import os
import sys

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_REC, MS_PRIVATE = 1 << 14, 1 << 18
WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
WORKDIR = "/tmp/work"
NOBODY = 65534


# ---------------------------------------------------------------- harness (runs as a script, stdlib only)

def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _pdeathsig(libc) -> None:
    import signal

    _check(libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0), "prctl(PDEATHSIG)")


def _mount_private(libc, limits: dict) -> None:
    """In C (root in fresh namespaces): fresh /proc, tmpfs over world-writable dirs, the work directory."""
    flags = MS_NOSUID | MS_NODEV
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    _check(libc.mount(b"proc", b"/proc", b"proc", flags | MS_NOEXEC, None), "mount proc")
    size = f"size={int(limits['file_mb']) * 4}m,mode=1777".encode()
    for path in WRITABLE_DIRS:
        if os.path.isdir(path):
            _check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", flags, size), f"mount tmpfs {path}")
    _expose_stdlib(libc, sys.base_prefix)


def _expose_stdlib(libc, prefix: str) -> None:
    """Make the interpreter's prefix readable by ``nobody`` when a private ancestor hides it (``/root/.pyenv``).

    The shallowest ancestor that others may not search is covered with an empty tmpfs (its contents stay
    hidden) and ``prefix`` is bind-mounted back read-only at its own path.
    """
    parts = os.path.abspath(prefix).split("/")[1:]
    hidden = next(("/" + "/".join(parts[:i]) for i in range(1, len(parts))
                   if not os.stat("/" + "/".join(parts[:i])).st_mode & 0o001), None)
    if hidden is None:
        return
    keep = os.open(prefix, os.O_PATH)
    _check(libc.mount(b"tmpfs", hidden.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=755"), "tmpfs")
    os.makedirs(prefix, mode=0o755)
    source, target = f"/proc/self/fd/{keep}".encode(), prefix.encode()
    _check(libc.mount(source, target, None, MS_BIND | MS_REC, None), f"bind {prefix}")
    _check(libc.mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None),
           f"remount {prefix} read-only")
    os.close(keep)


def _others_can_read(prefix: str) -> bool:
    """Whether a user other than the owner can reach ``prefix`` (every ancestor searchable by others)."""
    parts = os.path.abspath(prefix).split("/")[1:]
    return all(os.stat("/" + "/".join(parts[:i])).st_mode & 0o001 for i in range(1, len(parts) + 1))


def _drop_privileges(libc, limits: dict, uid: int, drop: bool = True) -> None:
    import resource as r

    cpu = int(limits["cpu_s"])
    mb = 1024 * 1024
    for name, value in ((r.RLIMIT_CPU, (cpu, cpu + 1)), (r.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2),
                        (r.RLIMIT_FSIZE, (limits["file_mb"] * mb,) * 2), (r.RLIMIT_CORE, (0, 0)),
                        (r.RLIMIT_NOFILE, (64, 64)), (r.RLIMIT_NPROC, (limits["max_procs"],) * 2)):
        r.setrlimit(name, value)
    if os.getuid() == 0 and drop:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")


def _guard_imports(forbidden: list[str]) -> None:
    """Refuse forbidden modules at import time and delete forbidden builtins."""
    import builtins

    def banned(name: str) -> bool:
        return any(name == f or name.startswith(f + ".") for f in forbidden)

    class Refuse:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if banned(name):
                raise ImportError(f"module {name!r} is forbidden in this task")
            return None

    for name in [m for m in sys.modules if banned(m)]:
        del sys.modules[name]
    sys.meta_path.insert(0, Refuse)
    for name in forbidden:
        builtins.__dict__.pop(name, None)


def _load_tests(job: dict, run):
    """Test callables ``test(namespace)``, defined before the program runs."""
    tests = []
    if job.get("check_module"):
        import builtins

        # A copy of builtins, taken before the program runs: patching ``builtins.abs`` does not reach ``check``.
        module = {"__name__": "checker", "__builtins__": dict(builtins.__dict__)}
        run(compile(job["check_module"], "<tests>", "exec"), module)
        check, entry, own = module["check"], job["entry_point"], set(module) | set(module["__builtins__"])

        def call_check(ns: dict) -> None:  # the test's own names and builtins win; helpers (HumanEval/32's
            # poly) come from ns
            module.update((k, v) for k, v in ns.items() if k not in own)
            check(ns[entry])

        tests.append(call_check)
    for i, source in enumerate(job.get("asserts", [])):
        code = compile(source, f"<test {i}>", "exec")
        tests.append(lambda ns, code=code: run(code, ns))
    return tests


def _describe(e: BaseException, type=type, BaseException=BaseException) -> str:  # bound before the program
    try:
        return f"{type(e).__name__}: {e}"[:200].replace("\n", " ")
    except BaseException:
        return "an exception"


def _audit_guard(refused_events=("ctypes.", "gc.", "sys._getframe", "sys._current_", "code.__new__",
                                 "sys.addaudithook"),
                 refused_attributes=frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"}),
                 error=RuntimeError) -> None:
    """Refuse, by audit hook (which the program cannot remove), what reaches the harness's frames or memory
    under any name: ctypes (its classes stay loaded, reachable through ``object.__subclasses__()``), gc,
    frames from tracebacks and generators, new code objects (crafted bytecode), other audit hooks.
    The hook uses only its default arguments: the program may patch builtins and the harness's globals."""

    def hook(event: str, args: tuple, refused_events=refused_events, refused_attributes=refused_attributes,
             error=error) -> None:
        if event.startswith(refused_events) or (event == "object.__getattr__" and args[1] in refused_attributes):
            raise error(f"{event} is refused in the sandbox")

    sys.addaudithook(hook)


def _child(job: dict, fd: int, lifeline: int, libc) -> None:
    """C: contain, load the tests, run the program, report each test that returned normally."""
    # The program may patch the harness's globals and builtins: what runs after it is bound here.
    run, write, exit_, describe, enumerate_, base_exception = exec, os.write, os._exit, _describe, enumerate, \
        BaseException
    settrace, setprofile = sys.settrace, sys.setprofile
    nonce = job.pop("nonce").encode()

    def report(line: str) -> None:
        write(fd, nonce + b" " + line.encode("utf-8", "replace") + b"\n")

    _pdeathsig(libc)
    if job["namespaces"]:
        _mount_private(libc, job["limits"])
        os.makedirs(WORKDIR, mode=0o700, exist_ok=True)
        if os.getuid() == 0:
            os.chown(WORKDIR, job["uid"], job["uid"])
        os.chdir(WORKDIR)
    else:
        os.chdir(job["workdir"])
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    # Without a mount namespace ``nobody`` cannot see an interpreter kept in a private directory
    # (/root/.pyenv): the program then keeps root's uid, under the same rlimits (see the docstring).
    drop = job["namespaces"] or _others_can_read(sys.base_prefix)
    if not drop and os.getuid() == 0:
        report(f"warn no privilege drop: {sys.base_prefix} is not readable by nobody without namespaces")
    _drop_privileges(libc, job["limits"], job["uid"], drop)
    _pdeathsig(libc)  # a change of credentials clears it
    os.set_blocking(lifeline, False)
    try:
        if os.read(lifeline, 1) == b"":  # EOF: H died before the signal was re-armed
            exit_(1)
    except BlockingIOError:  # H is alive
        pass
    os.close(lifeline)
    ns = {"__name__": "candidate", "__builtins__": __builtins__}
    try:
        tests = _load_tests(job, run)
        setup = compile(job.get("setup") or "", "<setup>", "exec")  # MBPP's fixtures use the program's classes
        program = compile(job.pop("program"), "<candidate>", "exec")
    except BaseException as e:
        report(f"error harness: {_describe(e)}")
        exit_(0)
    report(f"tests {len(tests)}")
    _guard_imports(job["forbidden"])
    for attr in ("_getframe", "_current_frames", "settrace", "setprofile", "_current_exceptions"):
        sys.__dict__.pop(attr, None)
    _audit_guard()
    try:
        run(program, ns)
        run(setup, ns)
    except base_exception as e:
        report(f"error {describe(e)}")
        exit_(0)
    for i, test in enumerate_(tests):
        settrace(None)
        setprofile(None)
        try:
            test(ns)
        except base_exception as e:
            report(f"fail {i} {describe(e)}")
            continue
        report(f"pass {i}")
    report("done")
    exit_(0)


def _harness_main(argv: list[str]) -> None:
    """H: read the job, arm PDEATHSIG, enter fresh namespaces, fork C and wait for it."""
    import marshal  # json would import re: 25 ms more per run

    fd, host_pid = int(argv[1]), int(argv[2])
    libc = _libc()
    _pdeathsig(libc)
    if os.getppid() != host_pid:  # the host died before the signal was armed
        os._exit(1)
    job = marshal.loads(sys.stdin.buffer.read())
    if job["namespaces"]:
        try:
            _check(libc.unshare(CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS), "unshare")
        except OSError as e:
            job["namespaces"] = False
            os.write(fd, job["nonce"].encode() + f" warn no namespaces ({e})\n".encode())
            os.makedirs(job["workdir"], mode=0o700, exist_ok=True)
            if os.getuid() == 0:
                os.chown(job["workdir"], job["uid"], job["uid"])
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(write_end)
        try:
            _child(job, fd, read_end, libc)
        finally:
            os._exit(1)
    os.close(read_end)
    os.close(fd)
    os.waitpid(pid, 0)
    os._exit(0)


if __name__ == "__main__":  # the harness ends here (os._exit): it never imports the host's modules below
    _harness_main(sys.argv)


# ---------------------------------------------------------------- host

import logging  # noqa: E402
import secrets  # noqa: E402
import selectors  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

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
            if root and _others_can_read(sys.base_prefix):
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
        proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), str(write_end),
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
