# forbidden: eval
# attack: the builtins module as print.__self__, its members listed by inspect.getmembers and the forbidden builtin picked by a computed key
# cause: bans
import inspect

members = dict(inspect.getmembers(print.__self__))
run = members[bytes([101, 118, 97, 108]).decode()]


def f(x):
    return run("x + 1", {"x": x})
