# attack: raise every rlimit back to unlimited (RLIMIT_AS, NPROC, CPU, FSIZE, NOFILE), then allocate 2 GiB; passes only if a limit was raised and the allocation held
# cause: resources
import resource

raised = []
for name in ("RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_DATA"):
    which = getattr(resource, name)
    soft, hard = resource.getrlimit(which)
    try:
        resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        raised.append(name)
    except (ValueError, OSError):
        pass
try:
    hog = bytearray(2 << 30)
except MemoryError:
    hog = None


def f(x):
    return x + 1 if raised and hog is not None else 0
