# attack: the function under test hangs
# cause: resources
def f(x):
    while True:
        pass
