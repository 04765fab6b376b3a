"""The channel between the program's process and the tests' process: plain data only, standard library only.

A message is an 8-byte big-endian length and that many bytes of JSON. Values
are encoded with tags, so the receiver builds genuine built-in objects and never
runs code of the sender's: whatever a hostile sender writes, the receiver gets
``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``,
``bytearray``, ``list``, ``tuple``, ``dict``, ``set``, ``frozenset`` or ``range``
(nested), or a :class:`WireError`.

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

>>> decode(encode({(1, 2): [b"x", {3}], "k": range(0, 4, 2)}))
{(1, 2): [b'x', {3}], 'k': range(0, 4, 2)}
"""

from __future__ import annotations

import base64
import json
import os
import sys

MAX_MESSAGE = 16 << 20  # bytes of one message
MAX_DEPTH = 200  # nesting of containers
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


_TYPES = {t.__name__: t for t in (int, float, complex, str, bytes, bytearray, bool, list, tuple, dict, set,
                                  frozenset, range, type(None), object)}


def encode(value, ref=None) -> bytes:
    """``value`` as a message body (JSON bytes); ``ref(v)`` gives the handle of a value that is not plain data."""
    try:
        text = json.dumps(_enc(value, 0, ref), allow_nan=True, separators=(",", ":"))
    except RecursionError:
        raise WireError("value nested too deeply") from None
    body = text.encode()
    if len(body) > MAX_MESSAGE:
        raise WireError(f"value larger than {MAX_MESSAGE} bytes")
    return body


def _enc(v, depth: int, ref=None):
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    t, d = type(v), depth + 1
    if v is None or t is bool or t is str:
        return v
    if t is float:
        return {"f": repr(v)} if v != v or v in (float("inf"), float("-inf")) else v
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        v = int(v)
        return v if -(1 << 62) < v < (1 << 62) else {"i": hex(v)}
    if isinstance(v, float):
        return _enc(float(v), depth)
    if t is type and _TYPES.get(v.__name__) is v:
        return {"type": v.__name__}
    if isinstance(v, str):
        return str(v)
    if isinstance(v, complex):
        return {"c": [repr(v.real), repr(v.imag)]}
    if isinstance(v, (bytes, bytearray)):
        return {"ba" if isinstance(v, bytearray) else "b": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, range):
        return {"r": [v.start, v.stop, v.step]}
    return _enc_container(v, d, ref)


def _enc_container(v, d: int, ref=None):
    if type(v) is list:
        return [_enc(x, d, ref) for x in v]
    if type(v) is tuple:
        return {"t": [_enc(x, d, ref) for x in v]}
    if type(v) is dict:
        return {"d": _pairs(v, d, ref)}
    # The standard library's value types, from sys.modules: a value cannot be one of a module not imported.
    decimal, fractions, collections = (sys.modules.get(m, _Absent) for m in ("decimal", "fractions", "collections"))
    name = type(v).__name__
    if isinstance(v, decimal.Decimal):
        return {"dec": str(v)}
    if isinstance(v, fractions.Fraction):
        return {"fr": [_enc(v.numerator, d, ref), _enc(v.denominator, d, ref)]}
    if isinstance(v, collections.deque):
        return {"dq": [[_enc(x, d, ref) for x in list(v)], v.maxlen]}
    if isinstance(v, collections.Counter):
        return {"ctr": _pairs(v, d, ref)}
    if isinstance(v, collections.OrderedDict):
        return {"od": _pairs(v, d, ref)}
    if isinstance(v, collections.defaultdict):
        factory = v.default_factory
        key = next((k for k, f in _BUILTIN_FACTORIES.items() if f is factory), None if factory else "")
        if key is None:
            raise WireError(f"a defaultdict whose factory is not a built-in type cannot cross ({factory!r:.60})")
        return {"dd": [key, _pairs(v, d, ref)]}
    if isinstance(v, list):
        return [_enc(x, d, ref) for x in list.__iter__(v)]
    if isinstance(v, tuple):
        return {"t": [_enc(x, d, ref) for x in tuple.__iter__(v)]}
    if isinstance(v, dict):
        return {"d": _pairs(v, d, ref)}
    if isinstance(v, (set, frozenset)):
        return {"fs" if isinstance(v, frozenset) else "s": [_enc(x, d, ref) for x in v]}
    if name in ("dict_keys", "dict_values", "dict_items"):
        return {name: [_enc(x, d, ref) for x in v]}
    if hasattr(type(v), "__next__") and hasattr(type(v), "__iter__"):
        items = []
        for x in v:
            if len(items) >= MAX_ITEMS:
                raise WireError(f"an iterator longer than {MAX_ITEMS} items cannot cross")
            items.append(_enc(x, d, ref))
        return {"it": items}
    if ref is not None:
        return {"h": ref(v)}
    raise not_plain(v)


class _Absent:
    """Stands for a module that is not imported: none of its types can match."""

    Decimal = Fraction = deque = Counter = OrderedDict = defaultdict = type("Never", (), {})


def _pairs(v, d: int, ref=None) -> list:
    return [[_enc(k, d, ref), _enc(x, d, ref)] for k, x in dict.items(v)]


def decode(body: bytes, deref=None):
    """The value a message body carries, built from built-in types only (and ``deref(payload)`` for handles)."""
    if len(body) > MAX_MESSAGE:
        raise WireError("message too large")
    try:
        return _dec(json.loads(body), 0, deref)
    except WireError:
        raise
    except (Exception, RecursionError) as e:  # ZeroDivisionError from a Fraction, decimal's InvalidOperation, ...
        raise WireError(f"malformed value ({type(e).__name__})") from None


def _dec(j, depth: int, deref=None):
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    d = (depth + 1, deref)
    if j is None or type(j) in (bool, int, float, str):
        return j
    if type(j) is list:
        return [_dec(x, *d) for x in j]
    if type(j) is not dict or len(j) != 1:
        raise WireError("malformed value")
    (tag, x), = j.items()
    if tag == "h":
        if deref is None:
            raise WireError("a handle where plain data was expected")
        return deref(x)
    if tag == "type":
        return _TYPES[x]
    return _DECODERS[tag](x, d)


def _dec_int(x, d):
    if type(x) is not str or len(x) > MAX_INT_HEX + 3:
        raise WireError("malformed integer")
    return int(x, 16)


def _dec_float(x, d):
    if x not in ("nan", "inf", "-inf"):
        raise WireError("malformed float")
    return float(x)


def _items(x, d) -> list:
    if type(x) is not list:
        raise WireError("malformed container")
    return [_dec(e, *d) for e in x]


def _dec_pairs(x, d) -> list:
    return [(_dec(k, *d), _dec(v, *d)) for k, v in (tuple(p) if type(p) is list and len(p) == 2 else () for p in x)]


def _dec_collection(tag):
    import collections

    return {"ctr": collections.Counter, "od": collections.OrderedDict}[tag]


def _dec_deque(x, d):
    import collections

    items, maxlen = x
    if maxlen is not None and type(maxlen) is not int:
        raise WireError("malformed deque")
    return collections.deque(_items(items, d), maxlen)


def _dec_defaultdict(x, d):
    import collections

    key, pairs = x
    factory = None if key == "" else _BUILTIN_FACTORIES[key]
    return collections.defaultdict(factory, _dec_pairs(pairs, d))


def _dec_decimal(x, d):
    import decimal

    if type(x) is not str or len(x) > 10_000:
        raise WireError("malformed decimal")
    return decimal.Decimal(x)


def _dec_fraction(x, d):
    import fractions

    n, m = (_dec(e, *d) for e in x)
    if type(n) is not int or type(m) is not int:
        raise WireError("malformed fraction")
    return fractions.Fraction(n, m)


def _dec_range(x, d):
    if not (type(x) is list and len(x) == 3 and all(type(e) is int for e in x)):
        raise WireError("malformed range")
    return range(*x)


def _dec_complex(x, d):
    re_, im = x
    if type(re_) is not str or type(im) is not str or len(re_) > 40 or len(im) > 40:
        raise WireError("malformed complex")
    return complex(float(re_), float(im))


def _dec_bytes(x, d):
    if type(x) is not str:
        raise WireError("malformed bytes")
    return base64.b64decode(x, validate=True)


_DECODERS = {
    "i": _dec_int, "f": _dec_float, "c": _dec_complex, "r": _dec_range,
    "b": _dec_bytes, "ba": lambda x, d: bytearray(_dec_bytes(x, d)),
    "t": lambda x, d: tuple(_items(x, d)), "s": lambda x, d: set(_items(x, d)),
    "fs": lambda x, d: frozenset(_items(x, d)), "d": lambda x, d: dict(_dec_pairs(x, d)),
    "od": lambda x, d: _dec_collection("od")(_dec_pairs(x, d)),
    "ctr": lambda x, d: _dec_collection("ctr")(dict(_dec_pairs(x, d))),
    "dq": _dec_deque, "dd": _dec_defaultdict, "dec": _dec_decimal, "fr": _dec_fraction,
    "it": lambda x, d: iter(_items(x, d)),
    "dict_keys": lambda x, d: dict.fromkeys(_items(x, d)).keys(),
    "dict_values": lambda x, d: dict(enumerate(_items(x, d))).values(),
    "dict_items": lambda x, d: dict(tuple(p) for p in _items(x, d)).items(),
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
