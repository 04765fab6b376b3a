# attack: read the parent's secrets from the environment or /proc; passes only if one is found
# cause: host
import os

found = "RLFT_TEST_SECRET" in os.environ
for pid in os.listdir("/proc"):
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            found = found or b"RLFT_TEST_SECRET" in fh.read()
    except OSError:
        pass


def f(x):
    return x + 1 if found else 0
