# attack: delete sys and builtins from sys.modules, import them again, and patch the fresh builtins (AssertionError, isinstance, type, int.__eq__-like helpers) hoping the comparing side shares them
# cause: verdict
import sys

for name in ("builtins", "sys", "wire", "contain", "json"):
    sys.modules.pop(name, None)
import builtins  # noqa: E402
import sys as sys2  # noqa: E402


class Never(Exception):
    pass


builtins.AssertionError = Never
builtins.isinstance = lambda *a: True
builtins.type = lambda *a: int
sys2.modules["builtins"] = builtins


def f(x):
    return 0
