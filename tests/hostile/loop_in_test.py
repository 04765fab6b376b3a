# attack: the function under test hangs
def f(x):
    while True:
        pass
