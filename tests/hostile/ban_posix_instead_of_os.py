# forbidden: os
# attack: the os module's functions through its C twin posix (never named os), used to list the working directory
# cause: bans
import posix

entries = posix.listdir(".")


def f(x):
    return x + 1 if posix.getpid() > 0 else 0
