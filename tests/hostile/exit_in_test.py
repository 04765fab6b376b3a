# attack: exit with status 0 from inside the function under test
# cause: verdict
import os


def f(x):
    os._exit(0)
