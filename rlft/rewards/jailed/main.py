"""A plain program's process (``rlft.rewards.sandbox.run_program``): run it as ``__main__``, its output on two pipes.

Run as ``python -I -S main.py OUT ERR``. After containment (``contain.start``, which points the standard streams
at /dev/null), fd OUT becomes stdout and fd ERR stderr, line-buffered so that what the program printed before a
deadline comes back. An uncaught exception prints its traceback (without this script's frame) to stderr and
exits with status 1, as ``python program.py`` does. Nothing here is trusted by the host: the program may
rewrite this module or its interpreter, and all it changes is what it prints and its exit status.
"""

from __future__ import annotations

import linecache
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contain  # noqa: E402

NAME = "<program>"


def main(argv: list[str]) -> None:
    fd_out, fd_err = int(argv[1]), int(argv[2])
    job = contain.start()
    for fd, std in ((fd_out, 1), (fd_err, 2)):
        os.dup2(fd, std)
        os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)
    sys.argv = [NAME]
    program = job["program"]
    linecache.cache[NAME] = (len(program), None, program.splitlines(True), NAME)  # source lines in tracebacks
    try:
        exec(compile(program, NAME, "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit:
        raise
    except BaseException as e:
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # from the program's own frame
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv)
