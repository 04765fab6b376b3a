# attack: open /proc/<pid>/mem, /proc/<pid>/environ, /proc/<pid>/maps and /proc/<pid>/fd of every other visible process, looking for the tests' process (its verdict pipe or memory)
# cause: verdict
import os

seen = []
me = str(os.getpid())
for pid in os.listdir("/proc"):
    if not pid.isdigit() or pid == me:
        continue
    for leaf in ("mem", "environ", "maps", "cmdline"):
        try:
            fd = os.open(f"/proc/{pid}/{leaf}", os.O_RDONLY)
            try:
                os.lseek(fd, 0x400000, 0) if leaf == "mem" else None
                data = os.read(fd, 4096)
            finally:
                os.close(fd)
            if b"tests.py" in data or leaf == "mem":
                seen.append((pid, leaf))
        except OSError:
            pass
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            seen.append((pid, os.readlink(f"/proc/{pid}/fd/{fd}")))
    except OSError:
        pass


def f(x):
    return x + 1 if seen else 0
