# attack: block every signal with pthread_sigmask, ignore the catchable ones, stop itself (SIGSTOP via pthread_kill) in f, and sleep past the deadline in a new session
# cause: resources
import os
import signal
import threading
import time

try:
    os.setsid()
except OSError:
    pass
for s in signal.valid_signals():
    try:
        signal.signal(s, signal.SIG_IGN)
    except (OSError, ValueError, RuntimeError):
        pass
signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())


def f(x):
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    time.sleep(3600)
    return 0
