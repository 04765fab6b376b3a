# forbidden: os, exec, eval
# attack: run a string of code without naming exec/eval: timeit compiles and runs its statement, which imports os under a split name
# cause: bans
import timeit

found = []
timeit.timeit("found.append(__import__('o' 's').getpid())", number=1, globals={"found": found})


def f(x):
    return x + 1 if found else 0
