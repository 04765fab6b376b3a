# forbidden: os
# attack: importlib.import_module with a string-built name
# cause: bans
import importlib

m = importlib.import_module("o" + "s")


def f(x):
    return x + 1
