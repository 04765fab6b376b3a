# forbidden: os
# attack: operator.attrgetter with a computed name (no getattr call, no string literal naming os) to fetch os from shutil
# cause: bans
import operator
import shutil

m = operator.attrgetter(bytes([111, 115]).decode())(shutil)


def f(x):
    return x + 1 if m.getpid() > 0 else 0
