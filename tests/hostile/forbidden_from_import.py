# forbidden: os
# attack: from os import path
from os import path


def f(x):
    return x + 1
