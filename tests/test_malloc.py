"""train.malloc (rlft.runs.malloc): what each mode resolves to, that it reaches the allocator, and what it does there."""

import ctypes
import json
import subprocess
import sys

import pytest

from rlft.runs import malloc
from rlft.config import ConfigError
from rlft.recipe import load_config

GLIBC = sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "mallopt")

# In a fresh process: set the allocator as argv[1] asks, then 24 times allocate, fill and free a 64 MiB tensor;
# report each round's page faults and how much of the block stayed resident after its free.
PROBE = """
import json, resource, sys
import torch
from rlft.runs import malloc

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024

applied, rounds = malloc.apply(sys.argv[1], {}), []
for _ in range(24):
    rss0, faults0 = rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(16 << 20)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    del x
    rounds.append({"faults": faults, "kept_mb": rss_mb() - rss0})
print(json.dumps({"applied": applied, "rounds": rounds}))
"""


def probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("env, expected", [
    ({}, "keep"),
    ({"ACCELERATE_USE_FSDP": "true"}, "release"),
    ({"ACCELERATE_USE_DEEPSPEED": "1"}, "release"),
    ({"ACCELERATE_USE_DEEPSPEED": "Yes"}, "release"),  # accelerate's flags in any case
    ({"ACCELERATE_USE_FSDP": "false"}, "keep"),
    ({"MALLOC_MMAP_THRESHOLD_": "131072"}, "default"),  # the user's own settings win
    ({"MALLOC_TRIM_THRESHOLD_": "0", "ACCELERATE_USE_FSDP": "true"}, "default"),
    ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"}, "default"),
    ({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"}, "keep"),  # tunables that are not malloc's
])
def test_auto_resolves_from_the_environment(env, expected):
    assert malloc.resolve("auto", env) == expected


@pytest.mark.parametrize("mode", ["keep", "release", "default"])
def test_explicit_modes_ignore_the_environment(mode):
    assert malloc.resolve(mode, {"ACCELERATE_USE_FSDP": "true", "MALLOC_TOP_PAD_": "0"}) == mode


def test_default_sets_nothing(monkeypatch):
    monkeypatch.setattr(malloc.ctypes, "CDLL", lambda *a: pytest.fail("default must not touch the allocator"))
    assert malloc.apply("default", {}) == "default"


def test_without_mallopt_nothing_is_set(monkeypatch):
    class NoMallopt:  # a C library without glibc's mallopt (macOS, Windows)
        pass

    monkeypatch.setattr(malloc.ctypes, "CDLL", lambda *a: NoMallopt())
    assert malloc.apply("keep", {}) == "default"


def test_refused_settings_are_reported(monkeypatch):
    class Refusing:
        @staticmethod
        def mallopt(param, value):
            return 0

    monkeypatch.setattr(malloc.ctypes, "CDLL", lambda *a: Refusing())
    assert malloc.apply("release", {}) == "default"


def test_config_key_and_wiring(monkeypatch):
    from rlft.runs import start as run

    seen = []
    monkeypatch.setattr(run.malloc, "apply", seen.append)
    run.process_settings(load_config(None, ["train.malloc=release"]))
    run.process_settings(load_config(None, []))
    assert seen == ["release", "auto"]
    with pytest.raises(ConfigError, match="train.malloc"):
        load_config(None, ["train.malloc=never"])


@pytest.mark.skipif(not GLIBC, reason="train.malloc sets glibc's malloc; this C library is not glibc")
def test_keep_reuses_freed_memory_and_release_returns_it():
    keep, release = probe("keep"), probe("release")
    assert keep["applied"] == "keep" and release["applied"] == "release"
    # release: every round maps its 64 MiB anew (16384 pages of 4 KiB, at least 32 of 2 MiB with transparent huge
    # pages), faults each page in, and hands the block back at its free
    assert all(r["faults"] >= 32 and r["kept_mb"] < 8 for r in release["rounds"]), release
    # keep: freed blocks stay in the process; once the heap holds enough of them (glibc 2.36: after 8 rounds,
    # posix_memalign asks a little more than the block freed before), each round reuses resident memory
    assert all(r["kept_mb"] > -8 for r in keep["rounds"]), keep
    assert sum(r["faults"] for r in keep["rounds"][-8:]) < 64, keep
