# attack: list, tuple, dict, str subclasses whose __eq__, __len__, __iter__, __getitem__ and __contains__ lie, returned as results in turn
# cause: verdict
class L(list):
    def __eq__(self, other):
        return True

    def __len__(self):
        return 2

    def __iter__(self):
        return iter([2, 6])


class T(tuple):
    def __eq__(self, other):
        return True

    def __getitem__(self, i):
        return 2


class D(dict):
    def __eq__(self, other):
        return True

    def items(self):
        return [(2, 6)]


class S(str):
    def __eq__(self, other):
        return True

    def __contains__(self, item):
        return True


calls = []


def f(x):
    calls.append(x)
    return [L(), T(), D(), S("")][len(calls) % 4]
