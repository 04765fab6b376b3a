# attack: spawn a shell that writes outside; passes only if the shell wrote its file
# cause: bans
import os
import subprocess

try:
    subprocess.run(["/bin/sh", "-c", "echo pwned > {CANARY_DIR}/shell.txt; echo pwned > /tmp/rlft_hostile_shell"],
                   timeout=1)
except Exception:
    pass


def f(x):
    return x + 1 if os.path.exists("{CANARY_DIR}/shell.txt") else 0
