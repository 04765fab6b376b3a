# attack: leave a detached process behind (new session, closed descriptors)
# cause: resources
import os
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in range(64):
            try:
                os.close(fd)
            except OSError:
                pass
        time.sleep(3600)
    os._exit(0)


def f(x):
    return 0
