# attack: add an audit hook, reach gc by a computed name and sys.modules to walk objects to the nonce
import sys

hooked = []
try:
    sys.addaudithook(lambda event, args: hooked.append(event))
except Exception:
    pass
m = sys.modules.get("g" + chr(99))
objects = getattr(m, "get_" + chr(111) + "bjects")() if m is not None else []


def f(x):
    return x + 1 if hooked or objects else 0
