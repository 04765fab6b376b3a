# forbidden: os
# attack: reach os as an attribute of another module
# cause: bans
import pathlib

m = pathlib.os


def f(x):
    return x + 1
