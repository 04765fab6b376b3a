# attack: sys.settrace and threading.settrace install a tracer that rewrites every frame's locals named like a result (value, answer, ok, passed) to pass-looking values
# cause: verdict
import sys
import threading

seen = []


def tracer(frame, event, arg):
    for key in ("passed", "ok", "result", "answer", "value", "expected"):
        if key in frame.f_locals:
            seen.append(key)
    if event == "return" and frame.f_code.co_name == "f":
        seen.append("f")
    return tracer


sys.settrace(tracer)
threading.settrace(tracer)


def f(x):
    return 0
