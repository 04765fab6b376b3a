# attack: anonymous mmap regions touched page by page, then one 64 GiB MAP_NORESERVE mapping; passes only if more than 1 GiB was mapped and written
# cause: resources
import mmap

maps, total = [], 0
try:
    for _ in range(64):
        m = mmap.mmap(-1, 64 << 20)
        for off in range(0, len(m), 1 << 16):
            m[off] = 1
        maps.append(m)
        total += len(m)
except (OSError, MemoryError, ValueError):
    pass
try:
    big = mmap.mmap(-1, 64 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0))
    big[(32 << 30)] = 1
    total += 64 << 30
except (OSError, MemoryError, ValueError, OverflowError):
    pass


def f(x):
    return x + 1 if total > (1 << 30) else 0
