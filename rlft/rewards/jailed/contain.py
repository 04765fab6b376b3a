"""What both jailed scripts do first: read the job, silence the standard streams, set rlimits, drop the uid."""

from __future__ import annotations

import os
import resource
import sys

SANDBOX_UID = 65534


def start() -> dict:
    """The job the host wrote to stdin (a wire message body), after containment; exits on a malformed job."""
    import wire

    data = b""
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        data += chunk
    job = wire.decode(data)
    contain(job["limits"], job["drop"])
    return job


def contain(limits: dict, drop: bool) -> None:
    """Standard streams to /dev/null; rlimits; as root of the namespace, become 65534 (the run's own host uid)."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    mb = 1 << 20
    cpu = int(limits["cpu_s"])
    for name, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),
                        (resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2),
                        (resource.RLIMIT_FSIZE, (limits["file_mb"] * mb,) * 2),
                        (resource.RLIMIT_CORE, (0, 0)), (resource.RLIMIT_NOFILE, (64, 64)),
                        (resource.RLIMIT_NPROC, (limits["max_procs"],) * 2)):
        resource.setrlimit(name, value)
    if drop:
        os.setgid(SANDBOX_UID)
        os.setuid(SANDBOX_UID)  # clears every capability; the seccomp filter is already in place
    if "/sandbox" in sys.path:
        sys.path.remove("/sandbox")


def describe(e: BaseException) -> str:
    """``Type: message``, one line, at most 200 characters, whatever ``__str__`` does."""
    try:
        return f"{type(e).__name__}: {e}"[:200].replace("\n", " ")
    except BaseException:
        return type(e).__name__ if isinstance(type(e).__name__, str) else "an exception"
