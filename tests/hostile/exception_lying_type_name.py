# attack: raise from f an exception class named "StopIteration"/"SystemExit" with a lying __str__, so the comparing side re-raises something its test loop might treat as success
# cause: verdict
class Fake(Exception):
    def __str__(self):
        return "pass"


Fake.__name__ = "SystemExit"
calls = []


def f(x):
    calls.append(x)
    if len(calls) == 1:
        raise Fake()
    e = Fake()
    type(e).__name__ = "StopIteration"
    raise e
