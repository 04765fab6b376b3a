# forbidden: os
# attack: import os.path as an alias
# cause: bans
import os.path as p


def f(x):
    return x + 1
