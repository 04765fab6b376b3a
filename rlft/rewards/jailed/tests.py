"""The tests' process: run the task's tests against the program's process and write the verdict.

Run as ``python -I -S tests.py IN OUT REPORT``: answers from the program's process
arrive on fd IN, requests leave on fd OUT (wire messages), and the verdict goes
to fd REPORT, one line per event, which only the host reads:
``tests N``, ``pass I``, ``fail I REASON``, ``error REASON``, ``crash REASON``, ``done``.

The tests' namespace is built here, from the task alone: HumanEval's prompt (its
imports and helper functions) and ``check``; MBPP's setup code and asserts. Every
free name of the tests resolves here (builtins, standard-library modules, names of
``STDLIB_SOURCES``), save the functions under test (HumanEval's entry point; per
MBPP test, the first call whose arguments call none of the program's names, see
:func:`bind`): those are proxies that send their arguments as plain data and
return the plain data that comes back; an object that is not plain data stays in
the program's process as a :class:`Remote` handle. Comparisons, tolerances and
helpers all run here, on genuine built-in objects.
"""

from __future__ import annotations

import builtins
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contain  # noqa: E402
import wire  # noqa: E402

NOT_PLAIN = wire.NOT_PLAIN


class Channel:
    """Requests to the program's process and their answers."""

    def __init__(self, fd_in: int, fd_out: int) -> None:
        self.fd_in, self.fd_out = fd_in, fd_out

    def receive(self) -> dict:
        try:
            message = wire.decode(wire.receive(self.fd_in), lambda payload: Remote(self, payload))
        except wire.TooDeep as e:  # read whole, so the channel stays in step: this test fails, the next ones run
            raise Unportable(f"{NOT_PLAIN} the program's answer: {e}") from None
        except wire.WireError as e:
            raise ProgramGone(f"the program's process sent no valid answer ({e})") from None
        if type(message) is not dict:
            raise ProgramGone("the program's process sent a malformed answer")
        return message

    def ask(self, request: dict, what: str = "") -> dict:
        try:
            body = wire.encode(request, Remote.handle_of)
        except wire.WireError as e:
            raise Unportable(f"{NOT_PLAIN} an argument of {what}: {e}") from None
        try:
            wire.send(self.fd_out, body)
        except OSError:
            raise ProgramGone("the program's process is gone") from None
        return self.receive()

    def call(self, request: dict, what: str):
        """The value the program's side answers with, or the exception it raised (as a built-in one)."""
        answer = self.ask(request, what)
        if "value" in answer:
            return answer["value"]
        if "raise" in answer and type(answer["raise"]) is list and len(answer["raise"]) == 2:
            kind, text = (str(x)[:200] for x in answer["raise"])
            cls = getattr(builtins, kind, None)
            if isinstance(cls, type) and issubclass(cls, Exception):
                raise cls(text)
            raise RuntimeError(text)
        if "unportable" in answer:
            raise Unportable(f"{NOT_PLAIN} the result of {what}: {str(answer['unportable'])[:150]}")
        raise ProgramGone("the program's process sent a malformed answer")


class ProgramGone(Exception):
    """The program's process ended or broke the channel."""


class Unportable(Exception):
    """A value that cannot cross the channel as plain data."""


class Remote:
    """An object that stays on the program's side: attributes and calls go there; compared by identity only."""

    __slots__ = ("_channel", "_id", "_type", "_truth")

    def __init__(self, channel: Channel, payload) -> None:
        if not (type(payload) is list and len(payload) == 3 and type(payload[0]) is int):
            raise wire.WireError("malformed handle")
        for slot, value in zip(self.__slots__, (channel, payload[0], str(payload[1])[:80], payload[2] is True)):
            object.__setattr__(self, slot, value)

    @staticmethod
    def handle_of(value):
        if type(value) is not Remote:
            raise wire.not_plain(value)
        return object.__getattribute__(value, "_id")

    def __getattr__(self, name: str):
        return self._channel.call({"getattr": [self, name]}, f"{self._type}.{name}")

    def __setattr__(self, name: str, value) -> None:
        self._channel.call({"setattr": [self, name, value]}, f"{self._type}.{name}")

    def __call__(self, *args, **kwargs):
        return self._channel.call({"call": [self, list(args), kwargs]}, f"{self._type}()")

    def __bool__(self) -> bool:
        return self._truth

    def __repr__(self) -> str:
        return f"<{self._type} of the program>"


def proxy(channel: Channel, name: str):
    def call(*args, **kwargs):
        return channel.call({"call": [name, list(args), kwargs]}, f"{name}()")

    call.__name__ = call.__qualname__ = name
    return call


def bind(channel: Channel, ns: dict, bindings: list) -> None:
    """Give ``ns`` the tests' free names as the host worked them out from the task's text
    (``rlft.rewards.bindings``): the program's functions as proxies, everything else from this interpreter's
    own builtins and standard library; a ``shadow`` name is the program's only where its module defines it."""
    import importlib

    shadowed = [b[0] for b in bindings if b[1] == "shadow"]
    if shadowed:
        answer = channel.ask({"defines": shadowed}).get("defines")
        shadowed = [n for n, yes in zip(shadowed, answer if type(answer) is list else []) if yes is True]
    for name, kind, *where in bindings:
        if kind == "shadow":
            if name in shadowed:
                kind = "program"
            else:
                kind, where = where[0], where[1:]
        if kind == "program":
            ns[name] = proxy(channel, name)
        elif kind == "module":
            ns[name] = importlib.import_module(where[0])
        elif kind == "stdlib":
            ns[name] = getattr(importlib.import_module(where[0]), name)


def build(job: dict, channel: Channel) -> list:
    """The tests, as callables of no argument, with their namespace built."""
    ns = {"__name__": "tests", "__builtins__": builtins}
    tests = []
    if job["check_module"]:
        entry = job["entry_point"]
        try:  # the prompt's imports and helpers (HumanEval/32's poly); a prompt that is not code brings none
            exec(compile(job["prompt"] or "", "<prompt>", "exec"), ns)
        except Exception:
            pass
        exec(compile(job["check_module"], "<tests>", "exec"), ns)
        ns[entry] = proxy(channel, entry)
        check = ns["check"]
        tests.append(lambda: check(ns[entry]))
    if job["asserts"]:
        bind(channel, ns, job["bindings"])
        exec(compile(job["setup"], "<setup>", "exec"), ns)
        for i, source in enumerate(job["asserts"]):
            code = compile(source, f"<test {i}>", "exec")
            tests.append(lambda code=code: exec(code, ns))
    return tests


def main(argv: list[str]) -> None:
    fd_in, fd_out, fd_report = int(argv[1]), int(argv[2]), int(argv[3])

    def report(line: str) -> None:  # one line: whatever a reason holds, no line break of any kind survives
        line = "".join(c if c.isprintable() else " " for c in line)
        os.write(fd_report, (line + "\n").encode("utf-8", "replace"))

    job = contain.start()
    channel = Channel(fd_in, fd_out)
    report(f"tests {job['n_tests']}")
    try:
        first = channel.receive()
    except (ProgramGone, Unportable):
        report("crash the program's process ended before it was ready")
        return
    if "ready" not in first:
        report(f"error {str(first.get('error', 'the program did not start'))[:200]}")
        return
    try:
        tests = build(job, channel)
    except ProgramGone as e:
        report(f"crash {e}")
        return
    except BaseException as e:
        report(f"error tests: {contain.describe(e)}")
        return
    for i, test in enumerate(tests):
        try:
            test()
        except Unportable as e:
            report(f"fail {i} {str(e)[:200]}")
        except BaseException as e:
            report(f"fail {i} {contain.describe(e)}")
        else:
            report(f"pass {i}")
    report("done")


if __name__ == "__main__":
    main(sys.argv)
    os._exit(0)
