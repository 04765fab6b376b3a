# forbidden: os
# attack: reach os as an attribute of another module
import pathlib

m = pathlib.os


def f(x):
    return x + 1
