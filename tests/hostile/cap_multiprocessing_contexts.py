# attack: multiprocessing Process, Pool and shared Manager under the fork, forkserver and spawn contexts; passes only if a child process ran
# cause: bans
import multiprocessing
import os

ran = []
for method in ("fork", "forkserver", "spawn"):
    try:
        ctx = multiprocessing.get_context(method)
        q = ctx.SimpleQueue()
        p = ctx.Process(target=q.put, args=(os.getpid(),))
        p.start()
        p.join(1)
        if not q.empty():
            ran.append(method)
    except Exception:
        pass
    try:
        with multiprocessing.get_context(method).Pool(2) as pool:
            ran.append(pool.apply(os.getpid))
    except Exception:
        pass


def f(x):
    return x + 1 if ran else 0
