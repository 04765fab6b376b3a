"""The program's process: run the untrusted program, then answer the tests' calls.

Run as ``python -I -S program.py IN OUT``: requests arrive on fd IN, answers leave
on fd OUT, both wire messages. Nothing here is trusted by the tests' side: the
program may rewrite this module, its interpreter or its memory, and all it can
change is the plain data it answers with.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contain  # noqa: E402
import wire  # noqa: E402


class Handles:
    """The program's objects the tests' side holds by number (their values never cross)."""

    def __init__(self) -> None:
        self.objects: list = []

    def ref(self, obj) -> list:
        self.objects.append(obj)
        try:
            truth = bool(obj)
        except BaseException:
            truth = True
        return [len(self.objects) - 1, type(obj).__name__[:80], truth]

    def deref(self, payload):
        if type(payload) is not int or not 0 <= payload < len(self.objects):
            raise wire.WireError("unknown handle")
        return self.objects[payload]


def main(argv: list[str]) -> None:
    fd_in, fd_out = int(argv[1]), int(argv[2])
    job = contain.start()
    ns = {"__name__": "candidate", "__builtins__": __builtins__}
    handles = Handles()
    try:
        exec(compile(job["program"], "<candidate>", "exec"), ns)
    except BaseException as e:
        _answer(fd_out, {"error": contain.describe(e)}, handles)
        os._exit(0)
    _answer(fd_out, {"ready": True}, handles)
    while True:
        try:
            request = wire.decode(wire.receive(fd_in), handles.deref)
        except wire.WireError:
            os._exit(0)
        _answer(fd_out, _handle(ns, request), handles)


def _handle(ns: dict, request: dict) -> dict:
    if "defines" in request:  # whether the program's own module defines these names (not its builtins)
        return {"defines": [name in ns for name in request["defines"]]}
    try:
        if "getattr" in request:
            return {"value": getattr(*request["getattr"])}
        if "setattr" in request:
            setattr(*request["setattr"])
            return {"value": None}
        target, args, kwargs = request["call"]
        if type(target) is str:
            if target not in ns:
                return {"raise": ["NameError", f"name {target!r} is not defined"]}
            target = ns[target]
        return {"value": target(*args, **kwargs)}
    except BaseException as e:
        return {"raise": [type(e).__name__, contain.describe(e)]}


def _answer(fd: int, message: dict, handles: Handles) -> None:
    try:
        body = wire.encode(message, handles.ref)
    except wire.WireError as e:
        body = wire.encode({"unportable": str(e)})
    except BaseException as e:
        body = wire.encode({"unportable": f"the value could not be read ({contain.describe(e)})"})
    try:
        wire.send(fd, body)
    except OSError:
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
    os._exit(0)
