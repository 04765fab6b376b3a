# attack: System V IPC and POSIX message queues without ctypes: /proc/sysvipc listing, creating a queue file under /dev/mqueue, and the _multiprocessing SemLock with an unlinkable name; passes only if an IPC object was created
# cause: resources
import os

made = []
try:
    os.makedirs("/dev/mqueue", exist_ok=True)
    fd = os.open("/dev/mqueue/rlft_hostile_mq", os.O_CREAT | os.O_RDWR, 0o666)
    made.append(fd)
except OSError:
    pass
try:
    import _multiprocessing

    sem = _multiprocessing.SemLock(1, 1, 1, "/rlft_hostile_sem", False)  # kind, value, maxvalue, name, unlink
    made.append(sem)
except Exception:
    pass
for table in ("shm", "sem", "msg"):
    try:
        with open(f"/proc/sysvipc/{table}") as fh:
            if len(fh.read().splitlines()) > 1:
                made.append(table)  # the host's objects are visible
    except OSError:
        pass


def f(x):
    return x + 1 if made else 0
