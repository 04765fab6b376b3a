# forbidden: os
# attack: import os
# cause: bans
import os


def f(x):
    return x + 1
