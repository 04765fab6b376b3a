# attack: return an int subclass whose __eq__/__ne__/__hash__/__bool__/__index__/__int__ lie (equal to everything), hoping it reaches the comparison
# cause: verdict
class Liar(int):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __hash__(self):
        return 0

    def __bool__(self):
        return True

    def __index__(self):
        return 2

    def __int__(self):
        return 0


def f(x):
    return Liar(0)
