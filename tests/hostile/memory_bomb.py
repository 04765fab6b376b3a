# attack: allocate without bound; passes only if it got more than the limit
# cause: resources
blocks = []
try:
    for _ in range(8192):
        blocks.append(bytearray(1 << 20))
except MemoryError:
    pass


def f(x):
    return x + 1 if len(blocks) >= 8192 else 0
