# attack: reach ctypes (loaded by the harness) through object.__subclasses__() without naming it, to read memory
# cause: verdict
import os


def walk(c, seen):
    for s in type.__subclasses__(c):
        if s.__name__ not in seen:
            seen[s.__name__] = s
            walk(s, seen)
    return seen


classes = walk(object, {})
libc = classes["CDLL"](None)
ok = libc.getpid() > 0
raw = classes["c_char"].from_address(id(classes)).value


def f(x):
    return x + 1 if ok else 0
