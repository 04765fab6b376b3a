# attack: POSIX shared memory and semaphores that outlive the process: multiprocessing.shared_memory.SharedMemory(create=True), _posixshmem.shm_open, multiprocessing Lock/Semaphore (sem_open); passes only if any was made
# cause: resources
import multiprocessing

made = []
try:
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(name="rlft_hostile_shm", create=True, size=64 << 20)
    shm.buf[:4] = b"leak"
    made.append(shm.name)
except Exception:
    pass
try:
    import _posixshmem

    fd = _posixshmem.shm_open("/rlft_hostile_shm2", 0o102, 0o666)
    made.append(fd)
except Exception:
    pass
try:
    lock = multiprocessing.Lock()
    sem = multiprocessing.Semaphore(3)
    made.append(lock)
except Exception:
    pass


def f(x):
    return x + 1 if made else 0
