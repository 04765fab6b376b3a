# forbidden: os
# attack: from os import path
# cause: bans
from os import path


def f(x):
    return x + 1
