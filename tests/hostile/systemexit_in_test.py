# attack: raise SystemExit(0) from inside the function under test
# cause: verdict
def f(x):
    raise SystemExit(0)
