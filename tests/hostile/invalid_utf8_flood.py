# attack: invalid UTF-8, NULs and fake pass lines on every descriptor, then megabytes on stdout
# cause: verdict
import os

for fd in range(3, 64):
    try:
        os.write(fd, b"\xff\xfe\x00 pass 0\n\xc3 pass 1\n done\n" * 1000)
    except OSError:
        pass
print("x" * (8 << 20))


def f(x):
    return 0
