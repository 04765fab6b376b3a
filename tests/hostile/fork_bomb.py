# attack: fork bomb (bounded by RLIMIT_NPROC as nobody, killed with the PID namespace)
# cause: resources
import os

while True:
    try:
        os.fork()
    except OSError:
        pass
