"""``custom``: a reward function of the user's own, named by where it lives.

::

    reward:
      fns:
        - {name: custom, fn: my_pkg.rewards:brevity}          # an importable module
        - {name: custom, fn: rewards/judge.py:score, slow: true}  # a file (relative to the working directory)

The function has one of the three reward shapes of ``rlft.rewards.base``:

- per-sample ``fn(completion: str, sample: Mapping) -> float | None`` (the default);
- group-level ``fn(completions, samples) -> list[float | None]``, one prompt's G
  completions at a time;
- batched ``fn(completions, samples) -> list[float | None]``, the whole batch at once.

The shape comes from ``kind``: ``auto`` (the default) reads the markers that
``rlft.rewards.group_level`` / ``batched`` (or ``pool.runs_in_pool``) set on the
function, so a decorated function needs nothing more; ``sample``, ``group`` or
``batch`` state it, and a function whose markers say otherwise is an error.
``slow: true`` (or a ``runs_in_pool`` marker) runs a per-sample function in the
run's worker processes with a deadline per sample.

A reward function written for TRL, ``fn(prompts, completions, **kwargs) ->
list[float]``, needs no wrapper: ``signature: trl`` calls it as TRL does, with
keyword arguments (``rlft.userfn.trl_arguments``): ``prompts`` (each row's
prompt, its text or its chat messages as a list of dicts), ``completions`` (the
texts, plain strings also for chat prompts) and one list per column of the
rows (``ground_truth``, ``data_source``, ``response``, ``num_tokens`` and the
dataset's own columns, the answer column under its own name, e.g. ``answer``;
None where a row lacks it). ``signature: auto`` (the default) reads it from the
function: a ``prompts`` parameter, or ``**kwargs`` and no ``sample`` /
``samples`` parameter (one without ``**kwargs`` gets only the arguments it
names). Such a function is batched (the whole batch in one call)
or, with ``kind: group``, group-level; TRL's ``completion_ids`` and
``trainer_state`` are not passed, and a None in its list is unscorable.

``sandboxed: true`` runs every call (one sample, or one group or batch) in a
short-lived child process of its own, killed after ``timeout_s`` seconds (its
start included); a crash, an exception or a hang there costs only that call's
samples, scored None like any failing reward. The child is a fresh interpreter,
not a fork of the trainer, and replies in JSON, so the function cannot
ordinarily read or change the trainer's memory and state; the spec is checked
in such a child too, so the trainer never imports the function's module. It is
not a sandbox for the host, nor a boundary against hostile code: the child runs
as the same user with the same files, network and environment (``rlft.userfn``
says more; untrusted programs belong in the code sandbox). Each call pays a
process start: tens of milliseconds, plus what the function's module imports.
A function given from Python with no import path (``fn: python:<name>``, ``rlft.train(rewards=[...])``) runs
in the trainer's process only: ``slow`` and ``sandboxed`` are refused for it.
A sandboxed function never runs in the worker pool: its ``runs_in_pool`` marker
is ignored, and ``slow: true`` with ``sandboxed: true`` is an error.

The spec is checked when the entry is built, at config parse time: a malformed
spec, a module or file that fails to import (its own exception is quoted), a
missing attribute, something not callable, a function whose signature cannot
take the two arguments of its shape (``score(completion)``), or a refused target
is a ``ValueError`` naming the spec. Before training, ``rlft train`` also calls
every reward on a few rows of the task (``rlft.rewards.trial``). Refused: anything from modules such as
``builtins``, ``os``, ``subprocess``, ``sys``, ``importlib`` or ``pickle``
(``builtins:exec`` would run every completion in the trainer), also when a
module of the user's re-exports it under another name, and anything but a
Python function or a callable instance of a Python class (see
``rlft.userfn``). Importing runs the module's top-level code, as ``python -m``
would. The reward stores only the spec (a file path made absolute), so it
pickles to worker processes, which import the function once each (cached per
process).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlft.rewards.base import REWARDS, check_choices
from rlft.userfn import PYTHON, call_in_child, markers, markers_in_child, resolve, trl_call
from rlft.userfn import target as userfn_target


@REWARDS.register("custom")
@dataclass(frozen=True)
class Custom:
    """The user's function named by ``fn`` (``package.module:function`` or ``path/to/file.py:function``).

    >>> fmt = Custom("rlft.rewards.math:format_reward")
    >>> fmt("#### 5", {}), fmt("5", {}), fmt.group_level, fmt.runs_in_pool
    (1.0, 0.0, False, False)
    >>> Custom("rlft.rewards.math:nope")
    Traceback (most recent call last):
    ValueError: fn: 'rlft.rewards.math:nope': no attribute 'nope' in rlft.rewards.math
    >>> Custom("builtins:exec")
    Traceback (most recent call last):
    ValueError: fn: 'builtins:exec': refused: module 'builtins' holds code-execution and process/system primitives, ...
    """

    fn: str
    """Where the function lives: 'package.module:function' or 'path/to/file.py:function'."""
    kind: Literal["auto", "sample", "group", "batch"] = "auto"
    """Its shape: per-sample, group-level or batched; auto reads rlft's markers on the function (a TRL-style function: batch)."""
    slow: bool = False
    """Run it in the worker pool with a deadline per sample (per-sample functions only)."""
    sandboxed: bool = False
    """Run each call in a short-lived child process with a deadline: protects the trainer, not the host."""
    timeout_s: float = 10.0
    """With sandboxed: each call's deadline in seconds, the child process's start included."""
    signature: Literal["auto", "rlft", "trl"] = "auto"
    """How it is called: rlft (fn(completion, sample), or fn(completions, samples) for a group or batch), trl (TRL's fn(prompts, completions, **columns) -> list[float], keyword arguments, the dataset's columns among them); auto: trl when it has a prompts parameter, or **kwargs and no sample/samples parameter."""

    def __post_init__(self) -> None:
        """Import the function now (errors at parse time) and record its shape, its signature and whether it is
        slow."""
        check_choices(self)
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s}")
        if self.slow and self.sandboxed:
            raise ValueError(f"slow: {self.fn!r} is sandboxed, so each call runs in a process of its own, not in "
                             "the worker pool; set slow or sandboxed, not both")
        target = userfn_target(self.fn)
        if target.startswith(PYTHON) and self.sandboxed:
            raise ValueError(f"sandboxed: {self.fn!r} is a Python function given to rlft.train, which a child "
                             "process cannot import; make it a top-level function of an importable module")
        marks = markers_in_child(target, self.fn, self.timeout_s) if self.sandboxed else \
            markers(resolve(target, self.fn))  # sandboxed: the module is never imported by the trainer
        trl = self.signature == "trl" or (self.signature == "auto" and marks["trl"])
        marked = "group" if marks["group_level"] else "batch" if marks["batched"] else None
        if self.kind != "auto" and marked is not None and marked != self.kind:
            raise ValueError(f"kind: {self.fn!r} is marked as a {marked}-level reward, not kind={self.kind}")
        if trl and self.kind == "sample":
            raise ValueError(f"kind: {self.fn!r} is called TRL's way (signature: {self.signature}), on a list of "
                             "completions: kind must be batch (the default for it) or group, not sample")
        shape = marked or (self.kind if self.kind != "auto" else "batch" if trl else "sample")
        if not trl and not marks.get("two_args", True):
            expected = "fn(completion, sample)" if shape == "sample" else "fn(completions, samples)"
            raise ValueError(f"fn: {self.fn!r}: {marks['signature'] or 'the function'} cannot be called as a "
                             f"{shape}-level reward, {expected}; give it that signature (or a TRL one: "
                             "fn(prompts, completions, **kwargs), with kind batch or group)")
        # sandboxed: a process per call instead of the pool (whose workers cannot start processes of their own)
        in_pool = not self.sandboxed and (self.slow or marks["runs_in_pool"])
        if in_pool and target.startswith(PYTHON):
            raise ValueError(f"slow: {self.fn!r} is a Python function given to rlft.train (a lambda, a closure or a "
                             "function of __main__), which the worker pool's processes cannot import; make it a "
                             "top-level function of an importable module, or drop slow")
        if in_pool and shape != "sample":
            raise ValueError(f"slow: only per-sample rewards run in the worker pool; {self.fn!r} is {shape}-level")
        # plain instance attributes (not fields): what score_batch and the trainer read; pickled with the instance
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "trl", trl)
        object.__setattr__(self, "group_level", shape == "group")
        object.__setattr__(self, "batched", shape == "batch")
        object.__setattr__(self, "runs_in_pool", in_pool)

    @property
    def deadline_s(self) -> float | None:
        """Sandboxed: what ``score_batch`` allows one call instead of ``reward.timeout_s``, a little over
        ``timeout_s`` so the child's own deadline decides; None (``reward.timeout_s``) otherwise."""
        return self.timeout_s + 1.0 if self.sandboxed else None

    def __call__(self, *args):
        """The user's function on ``(completion, sample)`` or ``(completions, samples)`` (TRL-style: on
        ``rlft.userfn.trl_arguments`` of them); sandboxed: in a child process, where a crash or the deadline raises
        here."""
        if self.sandboxed:
            return call_in_child(self.target, self.fn, args, self.timeout_s, trl=self.trl)
        fn = resolve(self.target, self.fn)
        return trl_call(fn, *args) if self.trl else fn(*args)
