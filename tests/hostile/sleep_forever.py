# attack: sleeps past every deadline, ignoring SIGTERM
# cause: resources
import signal
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(10**6)
