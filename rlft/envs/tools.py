r"""Tools, and the plain-text protocol a model without a tool-calling chat template calls them with.

The protocol (short on purpose: the embedded model reads and writes one character at a time)::

    the model writes           <call>NAME: ARGUMENTS</call>
    the environment answers    <result>OUTPUT</result>    or    <error>MESSAGE</error>

    e.g.   So the area is <call>calculator: 123*456</call><result>56088</result> square metres.

- ``ARGUMENTS`` as plain text is the value of the tool's single required string parameter (the calculator's
  ``expression``), spaces around it dropped; a JSON object (text starting with ``{``) gives the parameters by
  name (``<call>add: {"a": 1, "b": 2}</call>``); nothing (``<call>NAME</call>`` or ``NAME:``) gives none.
- The call read is the one the text ends on: its last ``<call>``, closed by the first ``</call>`` after it. An
  unclosed last ``<call>`` is an error even when an earlier call was complete (the model meant to call again);
  a ``</call>`` with no ``<call>`` is an error; text with neither tag holds no call.
- Whatever is wrong with a call (the tags, the name, the arguments, the tool's own refusal) is a
  :class:`ToolError` whose message is what the model reads inside ``<error>``: short and precise.
- Output longer than ``max_chars`` is cut there and marked ``...[cut]``.

A tool is a :class:`Tool`: a name, a description and a JSON-schema of its parameters (``schema(tool)`` is the
function schema transformers' ``apply_chat_template(tools=...)`` takes), and ``fn(**arguments) -> str``.
``TOOLS`` holds tool factories (``TOOLS.get(name)()`` builds one).

The built-in ``calculator`` does exact arithmetic on integers and fractions, bounded so that no input is slow:
see :func:`evaluate`. A result that is not whole is written ``p/q`` (``7/2``, ``-1/3``), never as a decimal:
the model can pass it back into a later expression as it is (decimal literals are refused), and it is exact
(``1/3`` has no finite decimal; writing ``1/4`` as ``0.25`` but ``1/3`` as ``1/3`` would be two formats).
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
import operator
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from rlft.registry import Registry

OPEN, CLOSE = "<call>", "</call>"
MAX_CALL_CHARS = 1000  # the longest NAME: ARGUMENTS read; a longer one is an error, not a slow parse
MAX_CHARS = 200  # the default cut of a result or an error
CUT = "...[cut]"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
               "array": (list,), "object": (dict,), "null": (type(None),)}


class ToolError(Exception):
    """A call the tool cannot answer; ``str(error)`` is the message the model reads."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call: ``fn(**arguments) -> str``, described for the model by ``description`` and
    ``parameters``, a JSON-schema ``{"type": "object", "properties": {...}, "required": [...]}``."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: Callable[..., str] = field(compare=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(f"name: letters, digits, _ and - (at most 64, not starting with a digit), "
                             f"got {self.name!r}")
        if not isinstance(self.description, str):
            raise ValueError(f"description: expected str, got {type(self.description).__name__}")
        if not callable(self.fn):
            raise ValueError(f"fn: expected a callable, got {type(self.fn).__name__}")
        _check_schema(self.name, self.parameters)

    @property
    def properties(self) -> Mapping[str, Any]:
        return self.parameters.get("properties", {})

    @property
    def required(self) -> list[str]:
        return list(self.parameters.get("required", []))


def _check_schema(name: str, params: Any) -> None:
    """``params`` is an object schema whose ``required`` names are among its ``properties``."""
    where = f"parameters of tool {name!r}"
    if not isinstance(params, Mapping) or params.get("type") != "object":
        raise ValueError(f"{where}: expected a JSON-schema {{'type': 'object', ...}}, got {params!r}")
    props, required = params.get("properties", {}), params.get("required", [])
    if not isinstance(props, Mapping) or not all(isinstance(k, str) and isinstance(v, Mapping)
                                                 for k, v in props.items()):
        raise ValueError(f"{where}: 'properties' must map names to schemas")
    if not isinstance(required, (list, tuple)) or not all(r in props for r in required):
        raise ValueError(f"{where}: 'required' must list names of 'properties', got {required!r}")


def schema(tool: Tool) -> dict[str, Any]:
    """The OpenAI-style function schema of ``tool``, as ``apply_chat_template(tools=[...])`` takes it.

    >>> schema(TOOLS.get("calculator")())["function"]["parameters"]["required"]
    ['expression']
    """
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": copy.deepcopy(dict(tool.parameters))}}


TOOLS: Registry[Callable[[], Tool]] = Registry("tool")


@dataclass(frozen=True)
class Call:
    """A well-formed call: the tool's name and its arguments, checked against the tool's parameters."""

    name: str
    arguments: Mapping[str, Any]


def clip(text: str, n: int = 24) -> str:
    """``text`` cut after ``n`` characters for a message: an error never echoes a long input."""
    return text if len(text) <= n else text[:n] + "..."


def short(text: str, n: int = 24) -> str:
    """``text`` clipped and quoted for a message."""
    return repr(clip(text, n))


def find_call(text: str) -> tuple[str, str] | None:
    """``(name, argument text)`` of the call ``text`` ends on, both stripped; None when it holds no call.

    >>> find_call("first <call>a: 1</call> then <call> calculator : 2+2 </call>")
    ('calculator', '2+2')
    >>> find_call("no call here") is None
    True
    """
    start = text.rfind(OPEN)
    if start < 0:
        if CLOSE in text:
            raise ToolError(f"{CLOSE} without {OPEN}")
        return None
    end = text.find(CLOSE, start)
    if end < 0:
        raise ToolError(f"unclosed {OPEN}: end the call with {CLOSE}")
    body = text[start + len(OPEN):end]
    if len(body) > MAX_CALL_CHARS:
        raise ToolError(f"call too long: {len(body)} chars, at most {MAX_CALL_CHARS}")
    name, _, arguments = body.partition(":")
    name = name.strip()
    if not name:
        raise ToolError(f"no tool name: write {OPEN}NAME: ARGUMENTS{CLOSE}")
    return name, arguments.strip()


def parse_call(text: str, tools: Mapping[str, Tool] | None = None) -> Call | None:
    """The call ``text`` ends on, its arguments checked against ``tools`` (name -> Tool; None: every tool in
    ``TOOLS`` whose factory needs no parameters); None when the text holds no call; a :class:`ToolError` for a
    malformed call.

    >>> parse_call("<call>calculator: 123*456</call>")
    Call(name='calculator', arguments={'expression': '123*456'})
    >>> parse_call("<call>calc: 1+1</call>")
    Traceback (most recent call last):
    rlft.envs.tools.ToolError: unknown tool 'calc'; tools: calculator, python
    """
    found = find_call(text)
    if found is None:
        return None
    name, argument_text = found
    if tools is None:
        tools = {n: TOOLS.get(n)() for n in TOOLS if _bare(TOOLS.get(n))}
    if name not in tools:
        raise ToolError(f"unknown tool {short(name)}; tools: {', '.join(sorted(tools)) or 'none'}")
    return Call(name, bind(tools[name], argument_text))


def _bare(factory: Callable[..., Tool]) -> bool:
    """Whether ``factory()`` builds a tool: none of its parameters is required (``lookup`` needs a ``path``)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return True
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)


def bind(tool: Tool, argument_text: str) -> dict[str, Any]:
    """The arguments of ``tool`` that ``argument_text`` gives (plain text, a JSON object, or nothing), checked."""
    if not argument_text:
        arguments: dict[str, Any] = {}
    elif argument_text.startswith("{"):
        arguments = load_json(argument_text)
    else:
        arguments = {_text_parameter(tool): argument_text}
    check_arguments(tool, arguments)
    return arguments


def load_json(text: str, what: str = "JSON arguments") -> Any:
    """The JSON value ``text`` holds (a dict when ``text`` is stripped and starts with ``{``), else a
    :class:`ToolError` ``bad {what}: ...``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ToolError(f"bad {what}: {e.msg} at char {e.pos}") from None
    except RecursionError:
        raise ToolError(f"bad {what}: nested too deeply") from None
    except ValueError as e:  # e.g. an integer past Python's digit limit
        raise ToolError(f"bad {what}: {str(e)[:60]}") from None
    return value


def _text_parameter(tool: Tool) -> str:
    """The one parameter plain-text arguments fill: the tool's single required string parameter."""
    required = tool.required
    if len(required) == 1 and tool.properties[required[0]].get("type", "string") == "string":
        return required[0]
    names = ", ".join(f'"{p}": ...' for p in (required or list(tool.properties)))
    raise ToolError(f"{tool.name} takes JSON arguments: {{{names}}}")


def check_arguments(tool: Tool, arguments: Mapping[str, Any]) -> None:
    """A :class:`ToolError` unless ``arguments`` are names of ``tool``'s parameters, its required ones among them,
    each of its schema's JSON type."""
    for key in arguments:
        if key not in tool.properties:
            takes = ", ".join(tool.properties) or "no arguments"
            raise ToolError(f"unknown argument {short(key)}; {tool.name} takes: {takes}")
    for key in tool.required:
        if key not in arguments:
            raise ToolError(f"missing argument {key!r} of {tool.name}")
    for key, value in arguments.items():
        kind = tool.properties[key].get("type")
        types = _JSON_TYPES.get(kind) if isinstance(kind, str) else None
        if types and (not isinstance(value, types) or (isinstance(value, bool) and kind != "boolean")):
            raise ToolError(f"argument {key!r}: expected {kind}, got {type(value).__name__}")


def cut(text: str, max_chars: int = MAX_CHARS) -> str:
    """``text``, or its first ``max_chars`` characters marked as cut.

    >>> cut("0123456789", 4)
    '0123...[cut]'
    """
    return text if len(text) <= max_chars else text[:max_chars] + CUT


def render_result(text: str, max_chars: int = MAX_CHARS) -> str:
    """The observation for a tool's output.

    >>> render_result("56088")
    '<result>56088</result>'
    """
    return f"<result>{cut(text, max_chars)}</result>"


def render_error(message: str, max_chars: int = MAX_CHARS) -> str:
    """The observation for a failed call.

    >>> render_error("division by zero")
    '<error>division by zero</error>'
    """
    return f"<error>{cut(message, max_chars)}</error>"


# ---- the calculator ---------------------------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 200
MAX_OPERATIONS = 64
LIMIT = 10**100  # every value's numerator and denominator stay below it
LIMIT_BITS = LIMIT.bit_length()  # 333: 2**332 < LIMIT < 2**333
MAX_EXPONENT = 1000
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: None}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_SYMBOLS = {ast.BitXor: "^ (write ** for powers)", ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<",
            ast.RShift: ">>", ast.MatMult: "@", ast.Invert: "~", ast.Not: "not"}
_REFUSED = {ast.Name: "names are not allowed", ast.Call: "function calls are not allowed",
            ast.Attribute: "attributes are not allowed", ast.Compare: "comparisons are not allowed",
            ast.BoolOp: "and/or are not allowed", ast.Subscript: "indexing is not allowed"}
ALLOWED = "integers, + - * / // % ** and parentheses"


def evaluate(expression: str) -> Fraction:
    """The exact value of ``expression``: integers, ``+ - * / // % **``, unary ``-``/``+``, parentheses.

    Parsed with :mod:`ast`, never run. ``/`` divides exactly. Bounds, each a :class:`ToolError`: at most 200
    characters and 64 operations; every value's numerator and denominator below ``10**100``; an exponent is a
    whole number from 0 to 1000, and a power whose result would pass the bound is refused before it is computed.

    >>> evaluate("(1 + 2) * 3 - 4 / 8")
    Fraction(17, 2)
    >>> evaluate("9**9**9")
    Traceback (most recent call last):
    rlft.envs.tools.ToolError: exponent must be from 0 to 1000, got 387420489
    >>> evaluate("1.5 * 2")
    Traceback (most recent call last):
    rlft.envs.tools.ToolError: decimal 1.5 is not allowed: write fractions as p/q, e.g. 3/2
    """
    text = expression.strip()
    if not text:
        raise ToolError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression too long: {len(text)} chars, at most {MAX_EXPRESSION_CHARS}")
    tree = _parse(text)
    operations = 0
    for node in ast.walk(tree):
        _check_node(node, text)
        operations += isinstance(node, (ast.BinOp, ast.UnaryOp))
    if operations > MAX_OPERATIONS:
        raise ToolError(f"too many operations: {operations}, at most {MAX_OPERATIONS}")
    return _value(tree.body)


def calculate(expression: str) -> str:
    """The calculator tool: ``expression``'s exact value as an integer or ``p/q``.

    >>> calculate("123*456"), calculate("7/2"), calculate("-2/6"), calculate("10/5")
    ('56088', '7/2', '-1/3', '2')
    """
    return str(evaluate(expression))  # Fraction's str: "p" when whole, else "p/q" in lowest terms


@TOOLS.register("calculator")
def calculator() -> Tool:
    """The built-in calculator tool."""
    return Tool("calculator", f"Exact arithmetic on {ALLOWED}; / gives a fraction p/q.",
                {"type": "object", "properties": {"expression": {
                    "type": "string", "description": "e.g. (12 + 3) * 4 / 5"}}, "required": ["expression"]},
                calculate)


def _parse(text: str) -> ast.Expression:
    try:
        with warnings.catch_warnings():  # e.g. "1(2)": a SyntaxWarning about calling an int
            warnings.simplefilter("ignore")
            return ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ToolError(f"not an expression: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes; a parser past its nesting limit
        raise ToolError(f"not an expression: {str(e)[:60] or type(e).__name__}") from None


def _check_node(node: ast.AST, text: str) -> None:
    """Refuse every node but the numbers and operators of :data:`ALLOWED`, naming what is wrong."""
    if isinstance(node, (ast.Expression, ast.operator, ast.unaryop)):
        return
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        symbol = _SYMBOLS.get(type(node.op), type(node.op).__name__)
        if type(node.op) not in (_BINARY if isinstance(node, ast.BinOp) else _UNARY):
            raise ToolError(f"operator {symbol} is not allowed; use {ALLOWED}")
        return
    if isinstance(node, ast.Constant):
        value = node.value
        if type(value) is int:
            return
        source = clip(ast.get_source_segment(text, node) or repr(value), 16)
        if isinstance(value, float):
            raise ToolError(f"decimal {source} is not allowed: write fractions as p/q, e.g. 3/2")
        raise ToolError(f"{source} is not allowed; use {ALLOWED}")
    message = _REFUSED.get(type(node), f"{type(node).__name__} is not allowed")
    raise ToolError(f"{message}; use {ALLOWED}")


def _value(node: ast.expr) -> Fraction:
    if isinstance(node, ast.Constant):
        return _bounded(Fraction(node.value))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_value(node.operand))
    left, right = _value(node.left), _value(node.right)
    if isinstance(node.op, ast.Pow):
        return _power(left, right)
    if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
        raise ToolError("division by zero")
    return _bounded(Fraction(_BINARY[type(node.op)](left, right)))


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    """``base ** exponent``, refused before it is computed when its size would pass :data:`LIMIT`."""
    if exponent.denominator != 1:
        raise ToolError(f"exponent must be a whole number, got {clip(str(exponent), 16)}")
    e = exponent.numerator
    if not 0 <= e <= MAX_EXPONENT:
        raise ToolError(f"exponent must be from 0 to {MAX_EXPONENT}, got {clip(str(e), 16)}")
    for part in (base.numerator, base.denominator):
        if (abs(part).bit_length() - 1) * e >= LIMIT_BITS:  # |part| ** e >= 2 ** ((bits - 1) * e) >= LIMIT
            raise _too_large()
    return _bounded(base**e)  # at most ~2 * LIMIT_BITS bits here: cheap


def _bounded(x: Fraction) -> Fraction:
    if abs(x.numerator) >= LIMIT or x.denominator >= LIMIT:
        raise _too_large()
    return x


def _too_large() -> ToolError:
    return ToolError("number too large: every value (numerator and denominator) must stay below 10**100")
