# forbidden: os
# attack: __import__('os')
# cause: bans
m = __import__("os")


def f(x):
    return x + 1
