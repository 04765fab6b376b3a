# forbidden: os
# attack: import os
import os


def f(x):
    return x + 1
