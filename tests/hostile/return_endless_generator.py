# attack: return a generator that never ends (the drain on the program's side must stop), and an itertools.count on the next call
# cause: verdict
import itertools


def forever():
    while True:
        yield 2


calls = []


def f(x):
    calls.append(x)
    return forever() if len(calls) == 1 else itertools.count(2)
