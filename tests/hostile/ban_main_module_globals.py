# forbidden: os
# attack: reach os through the harness's __main__ module globals in sys.modules, by a computed key
# cause: bans
import sys

main = sys.modules["__main__"]
m = main.__dict__["o" + "s"]


def f(x):
    return x + 1 if m.getpid() > 0 else 0
