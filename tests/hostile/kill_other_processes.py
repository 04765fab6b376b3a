# attack: os.kill SIGKILL/SIGSTOP to pids 1..100, killpg and kill(-1), hoping the tests' process dies or freezes after writing passes
# cause: verdict
import os
import signal

hit = []
me = os.getpid()
for pid in range(1, 101):
    if pid == me:
        continue
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        try:
            os.kill(pid, sig)
            hit.append(pid)
        except OSError:
            pass
for pgid in range(1, 101):
    if pgid == os.getpgrp():
        continue
    try:
        os.killpg(pgid, signal.SIGKILL)
        hit.append(-pgid)
    except OSError:
        pass
try:
    os.kill(-1, signal.SIGKILL)  # every process it may signal (itself excluded by the kernel)
except OSError:
    pass
# the jail's own init (pid 1) is the one process besides the program it may see; killing it kills the program
hit = [p for p in hit if p not in (1, -1)]


def f(x):
    return x + 1 if hit else 0
