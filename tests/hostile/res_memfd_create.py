# attack: os.memfd_create anonymous files grown with ftruncate and written, memory outside the address-space limit; passes only if one was created
# cause: resources
import os

made = []
for i in range(32):
    try:
        fd = os.memfd_create(f"hog{i}", getattr(os, "MFD_CLOEXEC", 1))
        os.ftruncate(fd, 1 << 30)
        os.pwrite(fd, b"x" * 4096, (1 << 30) - 4096)
        made.append(fd)
    except (OSError, AttributeError):
        break


def f(x):
    return x + 1 if made else 0
