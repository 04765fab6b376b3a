# attack: list / and walk it for anything beyond the interpreter, its libraries, the harness and the jail's /proc, /dev and /tmp (home directories, /etc, /work, /var, mounts of the host); passes only if such a path is found
# cause: host
import os
import sys

expected = ("/proc", "/dev", "/tmp", "/sandbox", "/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
prefix = os.path.realpath(sys.base_prefix)
extra = []
for top in os.listdir("/"):
    path = "/" + top
    if path in expected or prefix.startswith(path + "/") or prefix == path:
        continue
    extra.append(path)
for base in ("/root", "/home"):
    try:
        for name in os.listdir(base):
            if not prefix.startswith(os.path.join(base, name)):
                extra.append(os.path.join(base, name))
    except OSError:
        pass


def f(x):
    return x + 1 if extra else 0
