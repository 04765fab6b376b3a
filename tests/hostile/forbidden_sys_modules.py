# forbidden: os
# attack: fetch a forbidden module from sys.modules by a computed name
# cause: bans
import sys

m = sys.modules[chr(111) + chr(115)]


def f(x):
    return x + 1
