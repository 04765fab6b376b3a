# attack: a tracer that skips the failing assert (settrace is refused by name)
# cause: verdict
import sys


def skip(frame, event, arg):
    return None


sys.settrace(skip)


def f(x):
    return 0
