# forbidden: eval
# attack: a forbidden builtin by a name computed at run time (the sandbox deleted it)
# cause: bans
import builtins

ev = getattr(builtins, "".join(chr(c) for c in (101, 118, 97, 108)))


def f(x):
    return ev("x + 1", {"x": x})
