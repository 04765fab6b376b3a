# attack: os.execv a fresh python -c over the program's process: the new interpreter writes raw result lines and a bogus "ready" frame on every descriptor, then answers every call with 0
# cause: verdict
import os
import sys

payload = r"""
import json, os
lines = b"tests 2\npass 0\npass 1\ndone\n"
ready = json.dumps(["ready", True, ["d", 1]]).encode()  # the wire's form of {"ready": True}
for fd in range(3, 64):
    try:
        os.write(fd, lines)
        os.write(fd, len(ready).to_bytes(8, "big") + ready)
    except OSError:
        pass
zero = json.dumps(["value", 0, ["d", 1]]).encode()
while True:
    for fd in range(3, 64):
        try:
            os.write(fd, len(zero).to_bytes(8, "big") + zero)
        except OSError:
            pass
    import time
    time.sleep(0.05)
"""
os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", payload])


def f(x):
    return 0
