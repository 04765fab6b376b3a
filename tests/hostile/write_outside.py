# attack: write files outside the working directory (the test checks the host afterwards)
# cause: host
import os

for path in ["{CANARY_DIR}/pwned.txt", "/tmp/rlft_hostile_pwned.txt", "/var/tmp/rlft_hostile_pwned.txt",
             "/dev/shm/rlft_hostile_pwned.txt", "../rlft_hostile_pwned.txt", "/rlft_hostile_pwned.txt",
             os.path.expanduser("~/rlft_hostile_pwned.txt"), "{CANARY}"]:
    try:
        with open(path, "a") as fh:
            fh.write("pwned")
    except OSError:
        pass


def f(x):
    return 0
