"""A user's function named by where it lives (the ``custom`` reward's ``fn``), found, checked and called.

:func:`resolve` imports ``package.module:function`` or ``/abs/file.py:function`` once per process and refuses
what is not a reward but a code-execution or process/system primitive: anything from the modules in
:data:`BLOCKED_MODULES` (``builtins``, ``os``, ``subprocess``, ``sys``, ``importlib``, ``pickle``, ...), named
directly or re-exported under another name (the object found is checked, by identity and by the module it
comes from, not only the spec), and anything that is not a Python function or a callable instance of a Python
class (a ``builtin_function_or_method`` such as ``exec``, a class). ``functools.partial`` objects and bound
methods are judged by the function they wrap. These checks stop a recipe from naming ``builtins:exec`` as a
reward (which would run every completion in the trainer); they do not judge what a function of the user's own
does.

:func:`call_in_child` calls the function in a short-lived child process with a deadline (the ``custom`` reward's
``sandboxed: true``). The child starts from multiprocessing's fork server where the platform has one (a fresh
interpreter, never a fork of the trainer), else with ``spawn``, and replies in JSON (numbers, None, text and
lists; never a pickle, whose decoding could run code in the caller). It keeps the trainer's memory and state
(the model, optimizer, random states, imported modules) out of the function's ordinary reach, and a crash
(``os._exit``, a segfault) or a hang costs only that call: the child is killed at the deadline. It does
**not** protect the host, and it is no boundary against hostile code: the child runs as the same user, with
the same files, network and environment, so a function that deletes files or opens connections still does,
and it may signal the trainer or, where the kernel lets a user's processes trace each other, read it. Run
untrusted code in the code sandbox (``rlft.rewards.sandbox``) instead.

A function given from Python (``rlft.train(rewards=[...])``) that cannot be imported back by a name (a lambda, a
closure, a function of ``__main__``) is named ``python:<name>``: :func:`given` holds it for the call, and
:func:`resolve` finds it there; a process that does not hold it (a run resumed from the shell) gets a ValueError
saying to pass it again. :func:`import_path` is where an importable one is found instead (``module:qualname``).

This module imports neither torch nor ``rlft.rewards``, so a child starts in tens of milliseconds, plus what
the user's module imports (on every call: nothing is cached between children).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import multiprocessing
import numbers
import sys
import threading
import types
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence

BLOCKED_MODULES = frozenset({
    "builtins", "__builtin__", "os", "posix", "nt", "subprocess", "sys", "importlib", "runpy", "code", "codeop",
    "pty", "shutil", "ctypes", "pickle", "marshal", "shelve",
    # where the C parts of those live: open is _io.open, pickle.loads _pickle.loads, ...
    "io", "_io", "_pickle", "_posixsubprocess", "_ctypes", "_imp", "_frozen_importlib", "_frozen_importlib_external",
})
"""Modules (and their submodules) whose functions and classes are never a reward."""

_MAX_REPLY = 16 << 20  # bytes of a child's reply: a batch reward's list of floats fits many times over
_RESOLVED: dict[tuple[str, bool], Callable] = {}  # (target "module:attr" or "/abs/file.py:attr", classes) -> the object
_LOCK = threading.RLock()
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: set on classes made by a class statement, not on types written in C
PYTHON = "python:"
"""The prefix of a function given from Python with no import path: ``python:<name>``, held by :func:`given`."""
_GIVEN: dict[str, Callable] = {}  # "python:<name>" -> the function given to rlft.train in this process


@contextlib.contextmanager
def given(fns: Mapping[str, Callable]):
    """Hold ``fns`` (``python:<name>`` -> function) for :func:`resolve` while inside; what was held before under
    the same names comes back after. A function held under ``python:`` alone stands for every name not held (what
    evaluation, which never calls ``reward.fns``, gives a run's configuration)."""
    with _LOCK:
        before = {name: _GIVEN.get(name) for name in fns}
        _GIVEN.update(fns)
    try:
        yield
    finally:
        with _LOCK:
            for name, fn in before.items():
                _GIVEN.pop(name) if fn is None else _GIVEN.__setitem__(name, fn)


def import_path(fn: Callable) -> str | None:
    """``module:qualname`` that imports ``fn`` itself back, or None (a lambda, a closure, a function of
    ``__main__``, a partial or an instance: a ``python:<name>`` function).

    >>> import_path(import_path), import_path(lambda c, s: 0.0)
    ('rlft.userfn:import_path', None)
    """
    module, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not isinstance(fn, types.FunctionType) or not module or module == "__main__" or "<" in qual:
        return None
    obj = sys.modules.get(module)
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    return f"{module}:{qual}" if obj is fn else None


def _given(target: str, spec: str) -> Callable:
    """The function held under ``target`` (``python:<name>``), checked as :func:`resolve` checks one it imports."""
    with _LOCK:
        fn = _GIVEN.get(target, _GIVEN.get(PYTHON))
    if fn is None:
        raise ValueError(f"fn: {spec!r} is a Python function given to rlft.train(rewards=[...]), which this process "
                         "does not hold; pass it again through rlft.train(..., rewards=[...])")
    check_plain(fn, target[len(PYTHON):], spec)
    return fn


def resolve(target: str, spec: str, *, classes: bool = False) -> Callable:
    """The function at ``target`` (imported once per process); a ValueError naming ``spec`` when it is missing,
    not callable, or a refused target (see the module's docstring). ``classes``: a Python class of the user's own
    is accepted too (an environment's factory)."""
    if target.startswith(PYTHON):  # given from Python: looked up each time, never cached (another call, another one)
        return _given(target, spec)
    with _LOCK:
        if (target, classes) not in _RESOLVED:
            attr = target.rpartition(":")[2]
            obj = attribute(target, spec)
            if not callable(obj):
                raise ValueError(f"fn: {spec!r}: {attr!r} is a {type(obj).__name__}, not a function")
            check_plain(obj, attr, spec, classes=classes)
            _RESOLVED[target, classes] = obj
        return _RESOLVED[target, classes]


def check_module(target: str, spec: str) -> None:
    """A ValueError naming ``spec`` when ``target`` names a module of :data:`BLOCKED_MODULES` (before importing)."""
    where = target.rpartition(":")[0]
    if not _is_file(where) and _blocked(where):
        raise ValueError(f"fn: {spec!r}: refused: module {where!r} holds code-execution and process/system "
                         "primitives, not rewards; name a function of your own")


def check_plain(obj: Callable, attr: str, spec: str, *, classes: bool = False) -> None:
    """A ValueError naming ``spec`` unless ``obj`` is a Python function or a callable instance of a Python class
    (with ``classes``, also a Python class) from a module outside :data:`BLOCKED_MODULES` (a partial or a bound
    method: the function it wraps)."""
    inner = _unwrapped(obj)
    known = _primitives().get(id(inner))
    if known is not None and known[1] is inner:
        raise ValueError(f"fn: {spec!r}: refused: {attr!r} is {known[0]}, a code-execution or process/system "
                         "primitive, not a reward; name a function of your own")
    if isinstance(inner, types.FunctionType):
        module = inner.__module__
    elif isinstance(inner, type) and classes and inner.__flags__ & _HEAP_TYPE:
        module = inner.__module__  # a class made by a class statement, not a type written in C
    elif isinstance(inner, type):
        raise ValueError(f"fn: {spec!r}: refused: {attr!r} is a class; name a function or an instance")
    elif isinstance(getattr(type(inner), "__call__", None), types.FunctionType):
        check_plain(type(inner).__call__, f"{attr}.__call__", spec)  # a primitive assigned as __call__
        module = type(inner).__module__
    else:
        named = f" ({_name(inner)})" if hasattr(inner, "__qualname__") else ""
        raise ValueError(f"fn: {spec!r}: refused: {attr!r} is a {type(inner).__name__}{named}, not a Python "
                         "function or a callable instance of a class of your own")
    if _blocked(module or ""):
        raise ValueError(f"fn: {spec!r}: refused: {attr!r} is {_name(inner)} from module {module!r}, which holds "
                         "code-execution and process/system primitives, not rewards; name a function of your own")


def _unwrapped(obj):
    """The function a ``functools.partial`` or a bound method calls (through any number of them), else ``obj``."""
    while True:
        if isinstance(obj, functools.partial):
            obj = obj.func
        elif isinstance(obj, types.MethodType):
            obj = obj.__func__
        else:
            return obj


def _blocked(module: str) -> bool:
    """``module`` is one of :data:`BLOCKED_MODULES` or inside one."""
    return module.split(".")[0] in BLOCKED_MODULES


@functools.lru_cache(maxsize=1)
def _primitives() -> dict[int, tuple[str, object]]:
    """id -> (name, object) of the code-execution and process primitives refused wherever they are found."""
    import builtins
    import os
    import subprocess

    found = {f"builtins.{n}": getattr(builtins, n) for n in ("eval", "exec", "compile", "__import__", "open",
                                                               "breakpoint")}
    found.update({f"os.{n}": getattr(os, n) for n in dir(os)
                  if n.startswith(("system", "popen", "exec", "spawn", "fork", "posix_spawn", "kill", "_exit"))})
    found.update({f"subprocess.{n}": getattr(subprocess, n) for n in subprocess.__all__})
    return {id(obj): (name, obj) for name, obj in found.items() if callable(obj)}


def _name(obj) -> str:
    """``module.qualname`` of a function or class, else its type's name."""
    qual = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    module = getattr(obj, "__module__", None)
    return f"{module}.{qual}" if qual and module else (qual or type(obj).__name__)


FILE_MODULE = "rlft_custom_"  # the prefix of a module imported from a file named by path


def _is_file(where: str) -> bool:
    return where.endswith(".py") or "/" in where or "\\" in where


def _import(where: str, spec: str):
    """The module named ``where`` (a module name or an absolute file path), or a ValueError quoting the failure."""
    try:
        if not _is_file(where):
            return importlib.import_module(where)
        name = FILE_MODULE + hashlib.sha1(where.encode()).hexdigest()[:12]
        if name in sys.modules:
            return sys.modules[name]
        module_spec = importlib.util.spec_from_file_location(name, where)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module
    except (Exception, SystemExit) as e:
        raise ValueError(f"fn: {spec!r}: {type(e).__name__}: {e} (while importing {where})") from None


def attribute(target: str, spec: str):
    """The object at ``target`` (``module:attr`` or ``/abs/file.py:attr``), whatever it is (an environment object
    as well as a function), its module imported as :func:`resolve` imports it; a ValueError naming ``spec`` when
    the module is refused or fails to import, or has no such attribute. The caller judges what it finds."""
    where, _, attr = target.rpartition(":")
    check_module(target, spec)
    obj = _import(where, spec)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"fn: {spec!r}: no attribute {attr!r} in {where}")
        obj = getattr(obj, part)
    return obj


MARKERS = ("group_level", "batched", "runs_in_pool")
"""The attributes rlft's decorators set on a reward function (its shape, and whether it is slow)."""


def markers(fn: Callable) -> dict[str, bool | str]:
    """Which of :data:`MARKERS` ``fn`` carries, ``trl``: whether its signature is TRL's (:func:`trl_style`),
    ``two_args``: whether it can be called with two positional arguments, as rlft calls a reward, and
    ``signature``: its signature as text ("" when Python cannot read it)."""
    return {**{name: bool(getattr(fn, name, False)) for name in MARKERS}, "trl": trl_style(fn),
            "two_args": binds(fn, 2), "signature": _signature(fn)}


def binds(fn: Callable, n: int) -> bool:
    """Whether ``fn(a_1, ..., a_n)`` matches ``fn``'s signature (True when Python cannot read it).

    >>> binds(lambda completion, sample: 0, 2), binds(lambda completion: 0, 2), binds(lambda *a: 0, 2)
    (True, False, True)
    """
    try:
        inspect.signature(fn).bind(*range(n))
    except TypeError:
        return False
    except ValueError:  # no signature to read
        return True
    return True


def _signature(fn: Callable) -> str:
    try:
        return f"{getattr(fn, '__name__', type(fn).__name__)}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        return ""


def trl_style(fn: Callable) -> bool:
    """Whether ``fn`` is written as a TRL reward function, ``fn(prompts, completions, **kwargs) -> list[float]``,
    called with keyword arguments: it has a ``prompts`` parameter, or it takes ``**kwargs`` and has no parameter
    named ``sample`` or ``samples`` (rlft's shapes are called with two positional arguments and take no
    ``**kwargs``). A signature that cannot be read is not TRL's.

    >>> def accuracy(completions, answer, **kwargs): ...
    >>> def rlft_group(completions, samples): ...
    >>> trl_style(accuracy), trl_style(lambda prompts, completions: 0), trl_style(rlft_group)
    (True, True, False)
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a callable whose signature Python cannot read
        return False
    var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return "prompts" in params or (var_keyword and not {"sample", "samples"} & set(params))


TRL_RESERVED = ("prompt", "completion", "prompts", "completions", "completion_ids", "extra")
"""Sample keys never passed as TRL columns: the prompt and completion go as ``prompts`` and ``completions``, and
``extra`` (the row's other fields) is passed field by field."""


def trl_arguments(completions: Sequence[str], samples: Sequence[dict]) -> dict[str, list]:
    """The keyword arguments of a TRL-style call on ``completions`` and their ``samples``: ``prompts`` (each row's
    prompt: its text, or its chat messages as a list of dicts), ``completions`` (the texts) and one list per
    column: each key of the samples and of their ``extra`` (the dataset's other fields, including the answer
    column under its own name), None where a row lacks it; a dataset field wins over rlft's key of the same name.

    >>> got = trl_arguments(["#### 4"], [{"prompt": "2+2?", "ground_truth": "4", "extra": {"answer": "#### 4"}}])
    >>> got["prompts"], got["completions"], got["answer"], got["ground_truth"]
    (['2+2?'], ['#### 4'], ['#### 4'], ['4'])
    """
    rows = [{**{k: v for k, v in s.items() if k not in TRL_RESERVED},
             **{k: v for k, v in _fields(s.get("extra")).items() if k not in TRL_RESERVED}} for s in samples]
    columns = list(dict.fromkeys(k for row in rows for k in row))  # in order of first appearance
    prompts = [p if isinstance(p, str) else [dict(m) for m in p] for p in (s.get("prompt", "") for s in samples)]
    return {"prompts": prompts, "completions": list(completions),
            **{k: [row.get(k) for row in rows] for k in columns}}


def named_arguments(fn: Callable, arguments: Mapping[str, object]) -> Mapping[str, object]:
    """The keyword ``arguments`` ``fn`` takes: all of them when it has ``**kwargs`` (or Python cannot read its
    signature: everything, as TRL passes it), else only those it names.

    >>> named_arguments(lambda completions, answer: 0, {"prompts": 1, "completions": 2, "answer": 3})
    {'completions': 2, 'answer': 3}
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return arguments
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return arguments
    return {k: v for k, v in arguments.items() if k in params}


def trl_call(fn: Callable, completions: Sequence[str], samples: Sequence[dict]) -> list:
    """``fn`` called as TRL calls a reward function, ``fn(**trl_arguments(completions, samples))`` (a function
    without ``**kwargs`` gets only the arguments it names); what it returns as a list (a tuple or an array's
    ``tolist()``), checked value by value by the caller."""
    out = fn(**named_arguments(fn, trl_arguments(completions, samples)))
    if hasattr(out, "tolist") and not isinstance(out, (str, bytes)):  # a numpy array or a tensor
        out = out.tolist()
    return list(out) if isinstance(out, tuple) else out


def _fields(extra: object) -> Mapping:
    """A row's other fields (``sample["extra"]``): a mapping, else none."""
    return extra if isinstance(extra, Mapping) else {}


def markers_in_child(target: str, spec: str, timeout_s: float) -> dict[str, bool]:
    """:func:`markers` of the function at ``target``, found in a child process (as :func:`call_in_child`), so
    this process never imports its module; a ValueError naming ``spec`` when it is missing or refused, or when
    the import fails, dies or outlasts ``timeout_s``."""
    check_module(target, spec)  # no process for what the spec alone refuses
    try:
        found = _in_child(_markers, (target, spec), f"importing {spec!r}", timeout_s)
    except (RuntimeError, TimeoutError) as e:
        raise ValueError(f"fn: {spec!r}: {e}") from None
    if isinstance(found, str):  # resolve's ValueError, as its message
        raise ValueError(found)
    return found


def call_in_child(target: str, spec: str, args: Sequence, timeout_s: float, *, trl: bool = False):
    """``resolve(target, spec)(*args)`` in a child process of its own, killed after ``timeout_s`` seconds (its
    start included); what the function returns, or a RuntimeError / TimeoutError saying why there is nothing.
    ``trl``: called as TRL calls a reward function (:func:`trl_call` on ``args``, ``(completions, samples)``)."""
    return _in_child(_call_trl if trl else _call, (target, spec, tuple(args)), f"sandboxed {spec!r}", timeout_s)


def _in_child(work: Callable, args: tuple, what: str, timeout_s: float):
    """``work(*args)`` in a fresh child process with a deadline; ``what`` names it in the errors."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(work, args, send), daemon=True, name=f"rlft-userfn:{what}")
    try:
        child.start()
        send.close()  # the child holds the only writer: its death reads as the end of the pipe
        if not receive.poll(timeout_s):
            raise TimeoutError(f"{what} did not finish within {timeout_s}s; its process was killed")
        try:
            ok, value = json.loads(receive.recv_bytes(_MAX_REPLY))  # JSON, not pickle: decoding runs nothing
        except EOFError:
            child.join(1.0)
            raise RuntimeError(f"{what}: its process died (exit code {child.exitcode}) before it finished") from None
        except (OSError, ValueError, TypeError) as e:  # longer than _MAX_REPLY, or not what _child writes
            raise RuntimeError(f"{what}: its process sent an unreadable reply ({type(e).__name__})") from None
    finally:  # also on the caller's own timeout (scoring's RewardTimeout) while it waits
        send.close()
        receive.close()
        if child.is_alive():
            child.kill()
        if child.pid is not None:
            child.join()
    if not ok:
        raise RuntimeError(f"{what} raised {value}")
    return value


def _call(target: str, spec: str, args: tuple):
    """In the child: the user's function on ``args``."""
    return resolve(target, spec)(*args)


def _call_trl(target: str, spec: str, args: tuple):
    """In the child: the user's TRL-style function on ``args`` (completions, samples)."""
    return trl_call(resolve(target, spec), *args)


def _markers(target: str, spec: str) -> dict[str, bool] | str:
    """In the child: the function's markers, or the message of the ValueError that refuses it."""
    try:
        return markers(resolve(target, spec))
    except ValueError as e:
        return str(e)


def _child(work: Callable, args: tuple, send) -> None:
    """In the child: writes ``[true, value]`` (:func:`_plain` of what ``work(*args)`` returns) or
    ``[false, "<error>"]`` as JSON."""
    try:
        result = [True, _plain(work(*args))]
    except BaseException as e:  # SystemExit, KeyboardInterrupt too: reported, not a silent death
        result = [False, f"{type(e).__name__}: {e}"]
    send.send_bytes(json.dumps(result).encode())


def _plain(value):
    """``value`` as JSON can carry it: None, a bool, a number as a float, a str, or a list or dict of those; a
    TypeError for anything else (a reward returns numbers, None or lists of them; the caller checks which)."""
    if value is None or isinstance(value, bool):  # kept a bool, which the caller counts as 0 or 1
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {str(k): _plain(v) for k, v in value.items()}
    raise TypeError(f"returned a {type(value).__name__}, which cannot be sent back (numbers, None, text, lists)")


def target(spec: str, what: str = "function") -> str:
    """``module:attr`` as given, or ``/absolute/file.py:attr``; a ValueError naming the spec when malformed."""
    where, sep, attr = spec.rpartition(":")
    if not sep or not where.strip() or not attr.strip():
        raise ValueError(f"fn: {spec!r}: expected package.module:{what} or path/to/file.py:{what}")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where).expanduser()
        if not path.is_file():
            raise ValueError(f"fn: {spec!r}: no file {where!r} (relative to {Path.cwd()})")
        return f"{path.resolve()}:{attr}"
    if not all(part.isidentifier() for part in where.split(".")):
        raise ValueError(f"fn: {spec!r}: {where!r} is not a module name (or a path ending in .py)")
    return spec
