"""The channel between the program's process and the tests' process: plain data only, standard library only.

A message is an 8-byte big-endian length and that many bytes of JSON. Values
are encoded with tags, so the receiver builds genuine built-in objects and never
runs code of the sender's: whatever a hostile sender writes, the receiver gets
``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``,
``bytearray``, ``list``, ``tuple``, ``dict``, ``set``, ``frozenset`` or ``range``
(nested), or a :class:`WireError`.

The JSON is flat, so neither side recurses: a message is a list of operations in
postfix order, a leaf pushes a value (a JSON scalar, or a one-key object such as
``{"i": hex}`` or ``{"b": base64}``) and a container, a JSON array, pops its
items (``[n]`` is a list of the last ``n`` values, ``["d", n]`` a dict of the
last ``n`` key, value pairs). A value may nest ``MAX_DEPTH`` containers deep (1,024: Python's
default recursion limit, 1,000, bounds what a program can build or compare
recursively, plus the message's own envelope); deeper, the sender refuses it
and the receiver too, with a :class:`WireError` and never a ``RecursionError``.

Also admitted, because tests compare them as values and each is rebuilt from plain
data by the standard library on the receiving side: ``decimal.Decimal``,
``fractions.Fraction``, ``collections.OrderedDict``, ``Counter``, ``deque`` and a
``defaultdict`` whose factory is a built-in type; an iterator or generator is
drained (at most ``MAX_ITEMS`` items) and arrives as an iterator over a list, and
``dict`` views arrive as views of a fresh dict. Subclasses of the built-in types
(named tuples among them) arrive as their base type; the built-in types
themselves (``int``, ``str``, ...) cross by name.

Anything else crosses only where the sender gives ``encode`` a ``ref`` hook and
the receiver gives ``decode`` a ``deref`` hook: the program's side keeps the
object and sends a *handle* (a number, the type's name and the object's truth
value); the tests' side holds it as an opaque stand-in that can be passed back
in calls, have attributes read and set, and be called, all on the program's
side, but that compares only by identity. Without the hooks the sender raises
:class:`WireError` naming the type.

>>> encode({"k": [1, (2,)]})
b'["k",1,2,["t",1],[2],["d",1]]'
>>> decode(encode({(1, 2): [b"x", {3}], "k": range(0, 4, 2)}))
{(1, 2): [b'x', {3}], 'k': range(0, 4, 2)}
"""

from __future__ import annotations

import base64
import json
import os
import sys
from itertools import repeat

MAX_MESSAGE = 16 << 20  # bytes of one message
MAX_DEPTH = 1024  # nesting of containers: Python's default recursion limit (1000) and the message's envelope
MAX_ITEMS = 1_000_000  # items drained from one iterator
MAX_INT_HEX = 100_000  # hex digits of one integer
_BUILTIN_FACTORIES = {"int": int, "float": float, "str": str, "list": list, "dict": dict, "set": set,
                      "tuple": tuple, "bytes": bytes, "frozenset": frozenset, "bool": bool, "complex": complex}


NOT_PLAIN = "cannot cross:"  # starts the reason of a test failed by a value that cannot cross (counted by the host)


class WireError(Exception):
    """A value that cannot cross the channel, or a message that is not a valid one."""


def not_plain(value) -> WireError:
    """The error for a value of a type that has no plain-data form."""
    return WireError(f"a value of type {type(value).__name__!r} cannot cross (plain data only)")


class TooDeep(WireError):
    """A value nested deeper than ``MAX_DEPTH``: refused by the sender, or by the receiver whatever the sender."""


def too_deep() -> TooDeep:
    return TooDeep(f"value nested more than {MAX_DEPTH} containers deep")


_TYPES = {t.__name__: t for t in (int, float, complex, str, bytes, bytearray, bool, list, tuple, dict, set,
                                  frozenset, range, type(None), object)}


_CLOSE = -1  # the depth that marks a container's closing operation on the encoder's stack
_SMALL = 1 << 62  # integers within this cross as JSON numbers, larger ones as hex


def encode(value, ref=None) -> bytes:
    """``value`` as a message body (JSON bytes); ``ref(v)`` gives the handle of a value that is not plain data.

    Iterative (an explicit stack): a value nested ``MAX_DEPTH`` deep costs no recursion."""
    ops: list = []
    todo: list = [(value, 0)]  # (a value, its depth), or (a container's closing operation, _CLOSE)
    push, pop, emit = todo.append, todo.pop, ops.append
    while todo:
        v, depth = pop()
        if depth < 0:  # _CLOSE
            emit(v)
            continue
        if depth > MAX_DEPTH:
            raise too_deep()
        t = type(v)
        if t is str or v is None or t is bool or (t is int and -_SMALL < v < _SMALL):
            emit(v)  # the common leaves, without _node's checks
            continue
        op, items = ([len(v)], v) if t is list else _node(v, ref)
        if items is None:
            emit(op)
            continue
        push((op, _CLOSE))
        todo.extend(zip(reversed(items), repeat(depth + 1)))
    body = json.dumps(ops, allow_nan=True, separators=(",", ":")).encode()
    if len(body) > MAX_MESSAGE:
        raise WireError(f"value larger than {MAX_MESSAGE} bytes")
    return body


def _node(v, ref=None):
    """``(op, None)`` for a leaf, ``(closing op, items)`` for a container."""
    t = type(v)
    if v is None or t is bool or t is str:
        return v, None
    if t is float:
        return ({"f": repr(v)} if v != v or v in (float("inf"), float("-inf")) else v), None
    if isinstance(v, bool):
        return bool(v), None
    if isinstance(v, int):
        v = int(v)
        return (v if -_SMALL < v < _SMALL else {"i": hex(v)}), None
    if isinstance(v, float):
        return _node(float(v))
    if t is type and _TYPES.get(v.__name__) is v:
        return {"type": v.__name__}, None
    if isinstance(v, str):
        return str(v), None
    if isinstance(v, complex):
        return {"c": [repr(v.real), repr(v.imag)]}, None
    if isinstance(v, (bytes, bytearray)):
        return {"ba" if isinstance(v, bytearray) else "b": base64.b64encode(bytes(v)).decode()}, None
    if isinstance(v, range):
        return {"r": [v.start, v.stop, v.step]}, None
    return _container(v, ref)


def _container(v, ref=None):
    if type(v) is list:
        return [len(v)], v
    if type(v) is tuple:
        return ["t", len(v)], v
    if type(v) is dict:
        return _pairs("d", v)
    # The standard library's value types, from sys.modules: a value cannot be one of a module not imported.
    decimal, fractions, collections = (sys.modules.get(m, _Absent) for m in ("decimal", "fractions", "collections"))
    name = type(v).__name__
    if isinstance(v, decimal.Decimal):
        return {"dec": str(v)}, None
    if isinstance(v, fractions.Fraction):
        return {"fr": [hex(v.numerator), hex(v.denominator)]}, None
    if isinstance(v, collections.deque):
        items = list(v)
        return ["dq", len(items), v.maxlen], items
    if isinstance(v, collections.Counter):
        return _pairs("ctr", v)
    if isinstance(v, collections.OrderedDict):
        return _pairs("od", v)
    if isinstance(v, collections.defaultdict):
        factory = v.default_factory
        key = next((k for k, f in _BUILTIN_FACTORIES.items() if f is factory), None if factory else "")
        if key is None:
            raise WireError(f"a defaultdict whose factory is not a built-in type cannot cross ({factory!r:.60})")
        op, items = _pairs("dd", v)
        return ["dd", key, op[1]], items
    if isinstance(v, list):
        items = list(list.__iter__(v))
        return [len(items)], items
    if isinstance(v, tuple):
        items = list(tuple.__iter__(v))
        return ["t", len(items)], items
    if isinstance(v, dict):
        return _pairs("d", v)
    if isinstance(v, (set, frozenset)):
        items = list(v)
        return ["fs" if isinstance(v, frozenset) else "s", len(items)], items
    if name in ("dict_keys", "dict_values", "dict_items"):
        items = list(v)
        return [name, len(items)], items
    if hasattr(type(v), "__next__") and hasattr(type(v), "__iter__"):
        items = []
        for x in v:
            if len(items) >= MAX_ITEMS:
                raise WireError(f"an iterator longer than {MAX_ITEMS} items cannot cross")
            items.append(x)
        return ["it", len(items)], items
    if ref is not None:
        return {"h": ref(v)}, None
    raise not_plain(v)


class _Absent:
    """Stands for a module that is not imported: none of its types can match."""

    Decimal = Fraction = deque = Counter = OrderedDict = defaultdict = type("Never", (), {})


def _pairs(tag: str, v) -> tuple:
    items = [x for pair in dict.items(v) for x in pair]
    return [tag, len(items) // 2], items


def decode(body: bytes, deref=None):
    """The value a message body carries, built from built-in types only (and ``deref(payload)`` for handles).

    Iterative: a message nested deeper than ``MAX_DEPTH`` is refused with a WireError, whatever its size."""
    if len(body) > MAX_MESSAGE:
        raise WireError("message too large")
    try:
        return _run(json.loads(body), deref)
    except WireError:
        raise
    except RecursionError:  # JSON nested deeper than the parser goes: never a message encode writes
        raise too_deep() from None
    except Exception as e:  # ZeroDivisionError from a Fraction, decimal's InvalidOperation, ...
        raise WireError(f"malformed value ({type(e).__name__})") from None


def _run(ops, deref=None):
    """Replay the operations: leaves push a value, containers pop their items; exactly one value is left."""
    if type(ops) is not list:
        raise WireError("malformed message")
    values: list = []
    heights: list = []  # containers below each value: 0 for a leaf or an empty container
    push, push_height = values.append, heights.append
    for op in ops:
        t = type(op)
        if t is int or t is str or op is None or t is float or t is bool:
            push(op)
            push_height(0)
            continue
        if t is dict and len(op) == 1:
            (tag, x), = op.items()
            if tag not in _LEAVES:
                raise WireError("malformed value")
            push(_leaf(tag, x, deref))
            push_height(0)
            continue
        if t is not list or not op:
            raise WireError("malformed value")
        tag, x = ("L", op) if len(op) == 1 else (op[0], op[1:])  # [n] is a list, [tag, *arguments] the others
        if type(tag) is not str or tag not in _BUILDERS:
            raise WireError("malformed container")
        count, build = _BUILDERS[tag]
        n = count(x)
        if type(n) is not int or not 0 <= n <= len(values):
            raise WireError("malformed container")
        items, height = (values[-n:], max(heights[-n:]) + 1) if n else ([], 0)
        if height > MAX_DEPTH:
            raise too_deep()
        if n:
            del values[-n:], heights[-n:]
        push(build(x, items))
        push_height(height)
    if len(values) != 1:
        raise WireError("malformed message")
    return values[0]


def _leaf(tag: str, x, deref=None):
    if tag == "h":
        if deref is None:
            raise WireError("a handle where plain data was expected")
        return deref(x)
    if tag == "type":
        return _TYPES[x]
    return _LEAVES[tag](x)


def _dec_int(x, limit: int = MAX_INT_HEX):
    if type(x) is not str or len(x) > limit + 3:
        raise WireError("malformed integer")
    return int(x, 16)


def _dec_float(x):
    if x not in ("nan", "inf", "-inf"):
        raise WireError("malformed float")
    return float(x)


def _dec_decimal(x):
    import decimal

    if type(x) is not str or len(x) > 10_000:
        raise WireError("malformed decimal")
    return decimal.Decimal(x)


def _dec_fraction(x):
    import fractions

    if not (type(x) is list and len(x) == 2):
        raise WireError("malformed fraction")
    return fractions.Fraction(_dec_int(x[0]), _dec_int(x[1]))


def _dec_range(x):
    if not (type(x) is list and len(x) == 3 and all(type(e) is int for e in x)):
        raise WireError("malformed range")
    return range(*x)


def _dec_complex(x):
    re_, im = x
    if type(re_) is not str or type(im) is not str or len(re_) > 40 or len(im) > 40:
        raise WireError("malformed complex")
    return complex(float(re_), float(im))


def _dec_bytes(x):
    if type(x) is not str:
        raise WireError("malformed bytes")
    return base64.b64decode(x, validate=True)


_LEAVES = {
    "i": _dec_int, "f": _dec_float, "c": _dec_complex, "r": _dec_range, "dec": _dec_decimal, "fr": _dec_fraction,
    "b": _dec_bytes, "ba": lambda x: bytearray(_dec_bytes(x)), "h": None, "type": None,
}


def _dec_pairs(items: list) -> list:
    if len(items) % 2:
        raise WireError("malformed pairs")
    return list(zip(items[::2], items[1::2]))


def _collections():
    import collections

    return collections


def _dec_deque(x, items):
    maxlen = x[1]
    if maxlen is not None and type(maxlen) is not int:
        raise WireError("malformed deque")
    return _collections().deque(items, maxlen)


def _dec_defaultdict(x, items):
    key = x[0]
    factory = None if key == "" else _BUILTIN_FACTORIES[key]
    return _collections().defaultdict(factory, _dec_pairs(items))


def _count(x) -> int | None:
    """The items a container of one argument pops: ``[tag, n]``."""
    return x[0] if len(x) == 1 else None


def _pair_count(x) -> int | None:
    """The items a dict-like container pops: ``[tag, n]``, two values a pair."""
    return 2 * x[0] if len(x) == 1 and type(x[0]) is int else None


_BUILDERS = {
    "L": (_count, lambda x, items: items), "t": (_count, lambda x, items: tuple(items)),
    "s": (_count, lambda x, items: set(items)), "fs": (_count, lambda x, items: frozenset(items)),
    "d": (_pair_count, lambda x, items: dict(_dec_pairs(items))),
    "od": (_pair_count, lambda x, items: _collections().OrderedDict(_dec_pairs(items))),
    "ctr": (_pair_count, lambda x, items: _collections().Counter(dict(_dec_pairs(items)))),
    "dq": (lambda x: x[0] if len(x) == 2 else None, _dec_deque),
    "dd": (lambda x: _pair_count(x[1:]) if len(x) == 2 else None, _dec_defaultdict),
    "it": (_count, lambda x, items: iter(items)),
    "dict_keys": (_count, lambda x, items: dict.fromkeys(items).keys()),
    "dict_values": (_count, lambda x, items: dict(enumerate(items)).values()),
    "dict_items": (_count, lambda x, items: dict(tuple(p) for p in items).items()),
}


def send(fd: int, body: bytes) -> None:
    """Write one message to ``fd``."""
    data = len(body).to_bytes(8, "big") + body
    while data:
        data = data[os.write(fd, data):]


def receive(fd: int) -> bytes:
    """Read one message from ``fd``; WireError on EOF, a bad length or a short read."""
    size = int.from_bytes(_exactly(fd, 8), "big")
    if size > MAX_MESSAGE:
        raise WireError(f"message of {size} bytes is larger than {MAX_MESSAGE}")
    return _exactly(fd, size)


def _exactly(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise WireError("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
