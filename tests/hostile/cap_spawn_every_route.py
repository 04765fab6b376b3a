# attack: start a child process by every route a ban on os would miss: os.posix_spawn, os.forkpty, pty.fork, os.system, os.popen, subprocess.run; passes only if a child ran (it writes a marker)
# cause: bans
import os
import pty
import subprocess
import sys
import time

marker = os.path.join(os.getcwd(), "child_ran")
cmd = [sys.executable, "-I", "-S", "-c", f"open({marker!r}, 'w').write('1')"]
attempts = [
    lambda: os.posix_spawn(cmd[0], cmd, {}),
    lambda: os.posix_spawnp(cmd[0], cmd, {}),
    lambda: os.forkpty(),
    lambda: pty.fork(),
    lambda: os.system(" ".join(cmd[:3]) + " -c 'open(\"%s\",\"w\")'" % marker),
    lambda: os.popen("touch " + marker).read(),
    lambda: subprocess.run(cmd, timeout=1),
]
for attempt in attempts:
    try:
        r = attempt()
        if isinstance(r, tuple) and r[0] == 0:
            open(marker, "w").write("1")
            os._exit(0)
    except Exception:
        pass
time.sleep(0.2)


def f(x):
    return x + 1 if os.path.exists(marker) else 0
