"""How the process's C allocator treats freed memory (``train.malloc``), on glibc.

A training step allocates the same large tensors anew each time (activations, their gradients, logits). With
glibc's own settings many of them are mapped fresh from the system and faulted in page by page at every step:
glibc maps each block above a threshold with ``mmap`` and unmaps it when freed, and trims the top of its heap.
``keep`` raises both thresholds so that freed blocks stay in the heap and the next step reuses them. On a
33.6M model, 8 x 8 x 16 tokens on a 2-core CPU, the updates after the first two took 1-1829 minor page faults
each instead of 9,000-96,000, and 0.77 s instead of 0.82 s (medians of 3 interleaved runs), at the same peak.
``release`` fixes the mmap threshold at glibc's initial 128 KiB, so that every large freed block goes back to
the system at once: the lowest peak where a process frees large blocks of varying size, as FSDP and DeepSpeed
do when they gather and free whole weights (benchmarks/README.md, memory per process). Neither changes any
number the run computes.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

from rlft.parallel.launch import splits_models

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
KEEP = {M_MMAP_THRESHOLD: 1 << 30, M_TRIM_THRESHOLD: 2**31 - 1}  # blocks under 1 GiB from the heap, kept
RELEASE = {M_MMAP_THRESHOLD: 128 * 1024, M_TRIM_THRESHOLD: 128 * 1024}  # glibc's initial values, held fixed
_USER_SET = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def resolve(mode: str, env: Mapping[str, str] = os.environ) -> str:
    """The settings ``mode`` stands for in a process with environment ``env``: ``auto`` is ``default`` when the
    environment sets glibc's malloc itself, ``release`` under a sharded launch (FSDP, DeepSpeed) and ``keep``
    otherwise.

    >>> resolve("auto", {}), resolve("auto", {"ACCELERATE_USE_FSDP": "true"}), resolve("auto", {"MALLOC_TOP_PAD_": "0"})
    ('keep', 'release', 'default')
    """
    if mode != "auto":
        return mode
    if any(k in env for k in _USER_SET) or "glibc.malloc" in env.get("GLIBC_TUNABLES", ""):
        return "default"
    sharded = splits_models(env)
    return "release" if sharded else "keep"


def apply(mode: str, env: Mapping[str, str] = os.environ) -> str:
    """Set this process's allocator as ``mode`` (``auto``, ``keep``, ``release``, ``default``) resolves; returns
    what was set: ``keep``, ``release``, or ``default`` when nothing was (that mode, or a C library without
    glibc's ``mallopt``)."""
    mode = resolve(mode, env)
    if mode == "default":
        return mode
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return "default"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = KEEP if mode == "keep" else RELEASE
    if not all(mallopt(param, value) == 1 for param, value in settings.items()):  # 1: accepted
        return "default"
    return mode
