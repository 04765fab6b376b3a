# forbidden: os
# attack: __import__('os')
m = __import__("os")


def f(x):
    return x + 1
