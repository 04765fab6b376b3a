# forbidden: os
# attack: getattr under another name (an alias is not a call to getattr), with a name computed from character codes, to fetch os from pathlib
# cause: bans
import pathlib

fetch = getattr
m = fetch(pathlib, "".join(map(chr, (111, 115))))


def f(x):
    return x + 1 if m.getpid() > 0 else 0
