# attack: sys.setprofile watches the harness's C calls (os.write) and a wrapped os.write appends verdict lines and a second "ready" frame to every message the harness sends
# cause: verdict
import os
import sys

calls = []


def profiler(frame, event, arg):
    if event == "c_call" and getattr(arg, "__name__", "") == "write":
        calls.append(frame.f_code.co_name)
    return None


sys.setprofile(profiler)
real_write = os.write
extra = b"pass 0\npass 1\ndone\n"


def write(fd, data):
    n = real_write(fd, bytes(data) + extra)
    return min(n, len(data))


os.write = write


def f(x):
    return 0
