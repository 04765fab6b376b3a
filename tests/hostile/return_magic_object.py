# attack: return a plain object (crossing as a handle) whose every magic method says "equal": __eq__, __hash__, __bool__, __len__, __iter__, __float__, __index__, __sub__, __abs__, __lt__, __getattr__
# cause: verdict
class Everything:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __hash__(self):
        return hash(2)

    def __bool__(self):
        return True

    def __len__(self):
        return 1

    def __iter__(self):
        return iter([2])

    def __float__(self):
        return 2.0

    def __index__(self):
        return 2

    def __int__(self):
        return 2

    def __sub__(self, other):
        return 0

    __rsub__ = __sub__

    def __abs__(self):
        return 0

    def __lt__(self, other):
        return True

    def __getattr__(self, name):
        return lambda *a, **k: True


def f(x):
    return Everything()
