# forbidden: os, __import__
# attack: __import__ as the object path "builtins:__import__" given to pkgutil.resolve_name (one string, not the name), then os by a name from bytes
# cause: bans
import pkgutil

imp = pkgutil.resolve_name(":".join(["builtins", "_" * 2 + "import" + "_" * 2]))
m = imp(bytes([111, 115]).decode())


def f(x):
    return x + 1 if m.getpid() > 0 else 0
