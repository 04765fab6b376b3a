# attack: the harness's frames through a running generator's frame, named at run time
# cause: verdict
import os


def walker():
    frame = getattr(gen, "gi_" + chr(102) + "rame")
    while frame is not None:
        names = getattr(frame, "f_" + chr(108) + "ocals")
        if "report" in names:
            names["report"]("pass 0")
        frame = getattr(frame, "f_" + chr(98) + "ack")
    yield 0


def f(x):
    global gen
    gen = walker()
    return next(gen)
