# attack: reach the canary through a symlink made in the working directory
# cause: host
import os

try:
    os.symlink("{CANARY}", "link")
    with open("link", "w") as fh:
        fh.write("pwned")
    ok = True
except OSError:
    ok = False


def f(x):
    return x + 1 if ok else 0
