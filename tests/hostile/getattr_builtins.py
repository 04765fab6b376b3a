# forbidden: eval
# attack: reach a forbidden builtin through a string-built name
# cause: bans
import builtins

ev = getattr(builtins, "ev" + "al")


def f(x):
    return ev("x + 1", {"x": x})
