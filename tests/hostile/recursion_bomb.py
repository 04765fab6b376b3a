# attack: unbounded recursion, then a deep recursion limit
import sys

sys.setrecursionlimit(10**8)


def f(x):
    return f(x + 1)
