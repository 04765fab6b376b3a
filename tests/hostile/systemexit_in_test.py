# attack: raise SystemExit(0) from inside the function under test
def f(x):
    raise SystemExit(0)
