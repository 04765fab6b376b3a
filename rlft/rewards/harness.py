"""The sandbox's harness: run as a script (``python -I -S harness.py FD HOST_PID``), standard library only.

``rlft.rewards.sandbox`` starts it and documents what it protects against and
what it does not. Processes: **H** reads the job from stdin, arms
``PR_SET_PDEATHSIG``, enters fresh PID, network and mount namespaces and forks
**C**, PID 1 of the new PID namespace, which contains itself (mounts, rlimits,
``nobody``), loads the tests, runs the program, then each test, and writes a
line carrying the run's nonce to the pipe FD after each test that returned.
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


def others_can_read(prefix: str) -> bool:
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


def _contain(job: dict, lifeline: int, libc, report) -> None:
    """C, before the program: namespaces' mounts and work directory, null streams, rlimits, the user."""
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
    drop = job["namespaces"] or others_can_read(sys.base_prefix)
    if not drop and os.getuid() == 0:
        report(f"warn no privilege drop: {sys.base_prefix} is not readable by nobody without namespaces")
    _drop_privileges(libc, job["limits"], job["uid"], drop)
    _pdeathsig(libc)  # a change of credentials clears it
    os.set_blocking(lifeline, False)
    try:
        if os.read(lifeline, 1) == b"":  # EOF: H died before the signal was re-armed
            os._exit(1)
    except BlockingIOError:  # H is alive
        pass
    os.close(lifeline)


def _child(job: dict, fd: int, lifeline: int, libc) -> None:
    """C: contain, load the tests, run the program, report each test that returned normally."""
    # The program may patch the harness's globals and builtins: what runs after it is bound here.
    run, write, exit_, describe, enumerate_, base_exception = exec, os.write, os._exit, _describe, enumerate, \
        BaseException
    settrace, setprofile = sys.settrace, sys.setprofile
    nonce = job.pop("nonce").encode()

    def report(line: str) -> None:
        write(fd, nonce + b" " + line.encode("utf-8", "replace") + b"\n")

    _contain(job, lifeline, libc, report)
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


if __name__ == "__main__":  # the harness ends here (os._exit)
    _harness_main(sys.argv)
