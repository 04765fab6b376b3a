"""The code sandbox: limits checked with benign programs first, then the hostile corpus in tests/hostile/.

Every hostile program must score as not passing, leave the host's files (a
canary directory the test makes world-writable) and environment untouched, leave
no process of the sandbox user behind, and the corpus must finish in bounded
time. The corpus only runs where the sandbox is complete (root, namespaces):
without them a fork bomb would not be contained.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlft.rewards.code import Code
from rlft.rewards.sandbox import NOBODY, Limits, run

HOSTILE = Path(__file__).parent / "hostile"
CORPUS = sorted(HOSTILE.glob("*.py"))
TIMEOUT_S = 2.0
HUMANEVAL_TASK = {"code_prompt": 'def f(x):\n    """Add one."""\n', "entry_point": "f",
                  "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(5) == 6\n"}
MBPP_TASK = {"test_list": ["assert f(1) == 2", "assert f(5) == 6"]}


def _namespaces_work() -> bool:
    if os.geteuid() != 0:
        return False
    return subprocess.run(["unshare", "--pid", "--net", "--mount", "--fork", "true"], capture_output=True).returncode == 0


FULL_SANDBOX = _namespaces_work()
needs_full = pytest.mark.skipif(not FULL_SANDBOX, reason="the full sandbox needs root and namespaces (unshare)")


def sandbox_processes() -> list[int]:
    """Pids of processes owned by the sandbox user (nobody)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == NOBODY:
                    pids.append(int(entry))
            except FileNotFoundError:
                pass
    return pids


def no_sandbox_process_left(within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not sandbox_processes()


def test_a_program_and_its_tests():
    r = run("def add(a, b):\n    return a + b", asserts=("assert add(1, 2) == 3", "assert add(1, 1) == 3"))
    assert (r.status, r.n_tests, r.passed) == ("ok", 2, frozenset({0}))
    assert "AssertionError" in r.reason


def test_the_verdict_ignores_exit_status_and_stdout():
    r = run("print('pass 0')\nimport os\nos._exit(0)", asserts=("assert True",))
    assert (r.status, r.passed) == ("crashed", frozenset())


def test_a_hang_is_a_timeout_within_the_limit():
    t0 = time.monotonic()
    r = run("import time\ntime.sleep(60)", asserts=("assert True",), limits=Limits(timeout_s=1.0))
    assert r.status == "timeout" and not r.passed
    assert time.monotonic() - t0 < 3.0


def test_without_namespaces_the_fallback_still_judges_and_warns(caplog):
    """What a platform that refuses unshare gets: programs (and the stdlib) run, tests judge, hangs end."""
    ok = run("import re, heapq, collections\ndef add(a, b):\n    return a + b",
             asserts=("assert add(1, 2) == 3", "assert add(1, 1) == 3"), namespaces=False)
    assert (ok.status, ok.passed) == ("ok", frozenset({0}))
    hang = run("while True:\n    pass", asserts=("assert True",), limits=Limits(timeout_s=1.0), namespaces=False)
    assert hang.status == "timeout" and not hang.passed
    forged = run("print('pass 0')\nimport os\nos._exit(0)", asserts=("assert True",), namespaces=False)
    assert not forged.passed
    if os.geteuid() == 0:
        assert "code sandbox:" in caplog.text  # the weaker isolation is said, once


@needs_full
@pytest.mark.parametrize("program, limits, expect", [
    # benign programs that count how far they got: the limits hold before anything hostile runs
    ("import os, time\nn = 0\nfor _ in range(40):\n    try:\n        pid = os.fork()\n    except OSError:\n"
     "        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    n += 1\n",
     Limits(timeout_s=3, max_procs=8), "3 <= n <= 7"),  # 8 processes of nobody at most: the harness + 7
    ("b = []\ntry:\n    for _ in range(2000):\n        b.append(bytearray(1 << 20))\nexcept MemoryError:\n    pass\n"
     "n = len(b)\n", Limits(memory_mb=128), "60 < n < 128"),
    ("import signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\nn = 0\ntry:\n    with open('f', 'wb') as fh:\n"
     "        for _ in range(64):\n            fh.write(b'x' * (1 << 20))\n            fh.flush()\n            n += 1\n"
     "except OSError:\n    pass\n", Limits(file_mb=2), "n == 2"),
    ("import os\nn = (os.getuid(), os.getgid(), os.getpid(), os.getcwd(), sorted(os.environ))\n", Limits(),
     "n[:4] == (65534, 65534, 1, '/tmp/work') and set(n[4]) <= {'LC_CTYPE'}"),
])
def test_limits_with_benign_programs(program, limits, expect):
    r = run(program, asserts=(f"assert {expect}, n",), limits=limits)
    assert r.passed == frozenset({0}), r.reason
    assert no_sandbox_process_left()


def _hostile_cases():
    return [pytest.param(path, id=path.stem) for path in CORPUS]


def _header(text: str, key: str) -> str:
    for line in text.splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    return ""


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A world-writable canary directory outside tmp_path's private parents, a secret, a listening socket."""
    monkeypatch.setenv("RLFT_TEST_SECRET", "s3cret-value")
    canary_dir = Path("/tmp") / f"rlft-canary-{os.getpid()}"
    canary_dir.mkdir(exist_ok=True)
    canary = canary_dir / "canary.txt"
    canary.write_text("untouched")
    os.chmod(canary_dir, 0o777)
    os.chmod(canary, 0o666)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    leaks = ["/tmp/rlft_hostile_pwned.txt", "/var/tmp/rlft_hostile_pwned.txt", "/dev/shm/rlft_hostile_pwned.txt",
             "/rlft_hostile_pwned.txt", "/tmp/rlft_hostile_shell", "/root/rlft_hostile_pwned.txt"]
    before = {p: os.path.exists(p) for p in leaks}
    yield {"dir": canary_dir, "canary": canary, "listener": listener, "leaks": before}
    listener.close()
    for p, existed in before.items():
        if not existed and os.path.exists(p):
            os.remove(p)
    for f in canary_dir.iterdir():
        f.unlink()
    canary_dir.rmdir()


def _program(path: Path, host: dict) -> str:
    text = path.read_text()
    for key, value in (("{CANARY_DIR}", str(host["dir"])), ("{CANARY}", str(host["canary"])),
                       ("{PORT}", str(host["listener"].getsockname()[1])), ("{HOST_PID}", str(os.getpid()))):
        text = text.replace(key, value)
    return text


def _sample(path: Path) -> dict:
    task = HUMANEVAL_TASK if _header(path.read_text(), "task") == "humaneval" else MBPP_TASK
    return {"prompt": "", "extra": dict(task)}


def test_the_corpus_is_large_and_documented():
    assert len(CORPUS) >= 30
    assert all(_header(p.read_text(), "attack") for p in CORPUS)


@needs_full
def test_hostile_corpus_never_passes_and_leaves_nothing_behind(host):
    os.environ.pop("RLFT_UNRELATED", None)
    jobs = []
    for path in CORPUS:
        forbidden = tuple(n.strip() for n in _header(path.read_text(), "forbidden").split(",") if n.strip())
        reward = Code(timeout_s=TIMEOUT_S, forbidden=forbidden, max_procs=16, memory_mb=256, file_mb=8)
        jobs.append((path, reward, _program(path, host)))
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda job: job[1].check(f"```python\n{job[2]}\n```", _sample(job[0])), jobs))
    elapsed = time.monotonic() - t0
    passing = {p.stem: r for (p, _, _), r in zip(jobs, results) if r["passed"] or r["n_passed"]}
    assert passing == {}
    assert elapsed < len(CORPUS) * (TIMEOUT_S + 1) / 4 + 15  # bounded: every run ends by its own deadline
    assert host["canary"].read_text() == "untouched"
    assert sorted(f.name for f in host["dir"].iterdir()) == ["canary.txt"]
    assert {p: os.path.exists(p) for p in host["leaks"]} == host["leaks"]
    with pytest.raises(BlockingIOError):
        host["listener"].accept()  # nobody connected
    assert os.environ["RLFT_TEST_SECRET"] == "s3cret-value"
    assert no_sandbox_process_left()


@needs_full
@pytest.mark.parametrize("name, status", [("forbidden_import", "forbidden"), ("forbidden_importlib", "forbidden"),
                                          ("forbidden_runtime_name", "error"), ("getattr_builtins_runtime", "error"),
                                          ("loop_forever", "timeout"), ("os_exit_early", "crashed"),
                                          ("tracer", "forbidden"), ("frame_walk", "forbidden")])
def test_hostile_programs_fail_for_the_right_reason(name, status, host):
    path = HOSTILE / f"{name}.py"
    forbidden = tuple(n.strip() for n in _header(path.read_text(), "forbidden").split(",") if n.strip())
    result = Code(timeout_s=1.0, forbidden=forbidden).check(_program(path, host), _sample(path))
    assert result["status"] == status and not result["passed"], result


@needs_full
def test_the_tests_builtins_and_the_harness_loop_are_bound_before_the_program():
    """Shadowing or patching builtins that ``check`` or the harness's loop use does not make a test pass."""
    program = ("import builtins, sys\ndef abs(x):\n    return 0\nbuiltins.len = lambda x: 3\n"
               "builtins.enumerate = lambda t: [(i, lambda ns: None) for i in range(4)]\n"
               "sys.modules['__main__'].enumerate = builtins.enumerate\ndef f(x):\n    return [0]\n")
    check = "def check(candidate):\n    assert abs(candidate(1)[0] - 2) < 1e-9\n    assert len(candidate(1)) == 3\n"
    r = run(program, check_module=check, entry_point="f", asserts=("assert f(1) == [2]",))
    assert r.status == "ok" and r.passed == frozenset(), r


KNOWN_HOLES = {  # documented in rlft.rewards.sandbox ("does not protect against"); strict: a fix must update it
    "signal_handler_frame": (
        "import os, signal\n"
        "def h(signum, frame):\n"
        "    while frame is not None:\n"
        "        names = getattr(frame, 'f_' + chr(108) + 'ocals')\n"
        "        if 'report' in names:\n"
        "            names['report']('pass 0')\n"
        "        frame = getattr(frame, 'f_' + chr(98) + 'ack')\n"
        "signal.signal(signal.SIGALRM, h)\n"
        "def f(x):\n"
        "    signal.setitimer(signal.ITIMER_REAL, 0.001)\n"
        "    for _ in range(10 ** 6):\n"
        "        pass\n"
        "    return 0\n"),
    "ctypes_memmove": (
        "import os, re, sys\n"
        "def walk(c, seen):\n"
        "    for s in type.__subclasses__(c):\n"
        "        if s.__name__ not in seen:\n"
        "            seen[s.__name__] = s\n"
        "            walk(s, seen)\n"
        "    return seen\n"
        "copy = getattr(walk(object, {})['CDLL'].__init__, '__glob' + chr(97) + 'ls__')['memmove']\n"
        "found, buf = set(), bytes(1 << 20)\n"
        "for line in open('/proc/self/maps').read().splitlines():\n"
        "    addr, perms = line.split()[:2]\n"
        "    if perms.startswith('rw'):\n"
        "        lo, hi = (int(a, 16) for a in addr.split('-'))\n"
        "        for pos in range(lo, hi, len(buf)):\n"
        "            n = min(len(buf), hi - pos)\n"
        "            copy(id(buf) + 32, pos, n)\n"
        "            found |= set(re.findall(rb'(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])', buf[:n]))\n"
        "for nonce in found:\n"
        "    os.write(int(sys.argv[1]), nonce + b' pass 0\\n')\n"
        "def f(x):\n"
        "    return 0\n"),
}


@needs_full
@pytest.mark.xfail(strict=True, raises=AssertionError, reason="a known hole, documented in the sandbox")
@pytest.mark.parametrize("name", sorted(KNOWN_HOLES))
def test_known_holes_still_forge_a_pass(name):
    result = Code(timeout_s=3.0).check(f"```python\n{KNOWN_HOLES[name]}```", {"extra": dict(MBPP_TASK)})
    assert not result["n_passed"], result
