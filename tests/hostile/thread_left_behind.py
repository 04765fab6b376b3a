# attack: a thread that keeps running and tries to forge a report after the tests
# cause: verdict
import os
import threading
import time


def forge():
    while True:
        for fd in range(3, 64):
            try:
                os.write(fd, b"pass 0\npass 1\ndone\n")
            except OSError:
                pass
        time.sleep(0.01)


threading.Thread(target=forge, daemon=False).start()


def f(x):
    return 0
