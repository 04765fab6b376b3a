# forbidden: os
# attack: import os.path as an alias
import os.path as p


def f(x):
    return x + 1
