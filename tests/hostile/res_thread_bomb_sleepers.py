# attack: start threads in a loop, each sleeping for an hour, far past max_procs; passes only if more than 64 threads were running at once
# cause: resources
import threading
import time

started = 0
for _ in range(10000):
    try:
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
        started += 1
    except RuntimeError:
        break


def f(x):
    return x + 1 if threading.active_count() > 64 else 0
