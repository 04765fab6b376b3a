# attack: replace AssertionError, assert-like builtins and exit in builtins
# cause: verdict
import builtins


class Harmless(Exception):
    pass


builtins.AssertionError = Harmless
builtins.exit = builtins.quit = lambda *a: None
__builtins__ = {}


def f(x):
    return 0
