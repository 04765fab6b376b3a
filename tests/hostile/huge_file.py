# attack: write a huge file; passes only if it got past the file-size limit
# cause: resources
import signal

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
written = 0
try:
    with open("huge.bin", "wb") as fh:
        for _ in range(1024):
            fh.write(b"x" * (1 << 20))
            written += 1
except OSError:
    pass


def f(x):
    return x + 1 if written >= 1024 else 0
