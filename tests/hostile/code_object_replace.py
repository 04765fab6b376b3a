# attack: build code objects at run time (crafted bytecode reads arbitrary memory)
# cause: verdict
def g():
    return 0


g.__code__ = g.__code__.replace(co_consts=(None, 0))


def f(x):
    return g()
