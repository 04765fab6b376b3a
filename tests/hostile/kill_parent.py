# attack: kill the parent, the host (the test process) and everything else it can signal
# cause: host
import os
import signal

for pid in [os.getppid(), {HOST_PID}, -1]:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def f(x):
    return 0
