# attack: an exception whose __str__ (run while the harness reports it) patches builtins, and whose __del__ exits
# cause: verdict
import builtins


class Sneaky(BaseException):
    def __str__(self):
        builtins.enumerate = lambda tests: [(i, lambda ns: None) for i in range(8)]
        builtins.BaseException = type("Nothing", (Exception,), {})
        return "x" * 100000

    def __del__(self):
        raise SystemExit(0)


def f(x):
    raise Sneaky()
