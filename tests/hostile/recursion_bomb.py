# attack: unbounded recursion, then a deep recursion limit
# cause: resources
import sys

sys.setrecursionlimit(10**8)


def f(x):
    return f(x + 1)
