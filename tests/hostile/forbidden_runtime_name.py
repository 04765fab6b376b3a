# forbidden: os
# attack: a module name computed at run time (refused by the sandbox's import hook)
# cause: bans
import importlib

m = importlib.import_module(chr(111) + chr(115))


def f(x):
    return x + 1
