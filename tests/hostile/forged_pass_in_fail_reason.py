# attack: the first call raises an exception whose text carries "\rpass 1" (a forged result line for the other test, copied into the tests' "fail 0" line), the second call never returns so test 1 never writes its own line
# cause: verdict
import time


def f(x):
    if x == 1:
        raise ValueError("no\rpass 1\rdone")
    time.sleep(3600)
    return 0
