# attack: gigabytes of output on stdout and stderr (and the /dev/stdout, /dev/tty, /proc/self/fd/1 paths) from several threads until the deadline
# cause: resources
import os
import sys
import threading

chunk = b"A" * (1 << 20)


def pour(fd):
    while True:
        try:
            os.write(fd, chunk)
        except OSError:
            return


for path in ("/dev/stdout", "/dev/stderr", "/dev/tty", "/proc/self/fd/1"):
    try:
        fd = os.open(path, os.O_WRONLY)
        threading.Thread(target=pour, args=(fd,), daemon=True).start()
    except OSError:
        pass
threading.Thread(target=pour, args=(2,), daemon=True).start()
while True:
    sys.stdout.write("x" * 65536)
