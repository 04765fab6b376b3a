"""Data-parallel RL over several processes, started by ``accelerate launch`` or ``torchrun``.

Every process holds the whole policy. An RL step splits the P prompts into
contiguous shares, one per process; each process generates and scores its
share, then the scored samples are gathered so that every process holds the
same global batch. What depends on the whole batch (group baselines, batch
whitening, dynamic sampling, metrics, the KL controller) is then computed
identically everywhere, exactly as one process would. The forward and backward
passes are split again: each process takes its share of every mini-batch,
divides its loss by the whole mini-batch's normaliser, and the gradients are
summed over the processes before the optimizer step, so the update is the one
process's update (up to the order of float additions) whatever the number of
processes. Only the main process writes logs, checkpoints and models, and
evaluates.

The process group comes from ``accelerate``'s ``PartialState``: NCCL on GPUs
(one device per process), gloo on CPU. A one-process run never touches
``torch.distributed``.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, NoReturn

import torch

# a process waits this long for the others, e.g. while the main process alone runs an evaluation or an SFT stage
TIMEOUT = datetime.timedelta(hours=6)


@dataclass(frozen=True)
class Dist:
    """Which of ``world`` processes this is (``rank``); the default is the one-process run."""

    rank: int = 0
    world: int = 1
    shard: Any = None
    """An FSDP launch's plan (rlft.parallel.fsdp): the RL policy is sharded over the processes; None: whole in each."""
    zero: Any = None
    """A DeepSpeed launch's plan (rlft.parallel.zero): the RL policy trains in a ZeRO engine; None: no DeepSpeed."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def share(self, n: int) -> slice:
        """This process's contiguous part of ``n`` items; the first ``n % world`` processes take one more."""
        base, extra = divmod(n, self.world)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + int(self.rank < extra))

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` of every process, in rank order (picklable objects; tensors should be on the CPU)."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """The main process's ``obj``, on every process."""
        if not self.active:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def on_main(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` run by the main process alone (writing files, evaluating); its result on every process.

        The others wait; if the main process fails, the launcher stops them. While ``fn`` runs, ``current()`` is
        the one-process ``Dist``, so nothing inside waits for the others."""
        global _SOLO
        if not self.is_main:
            return self.broadcast(None)
        _SOLO = True
        try:
            result = fn()
        finally:
            _SOLO = False
        return self.broadcast(result)

    @contextmanager
    def main_first(self) -> Iterator[None]:
        """The block runs in the main process, then in the others (the main one writes what they then read)."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()

    def sum_floats(self, values: dict[str, float]) -> dict[str, float]:
        """Per key, the sum over the processes (a key missing in a process counts 0 there)."""
        if not self.active:
            return values
        out: dict[str, float] = {}
        for part in self.gather(values):
            for k, v in part.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def sum_grads_(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Replace each trainable parameter's gradient by its sum over the processes (one collective)."""
        if not self.active:
            return
        params = [p for p in params if p.requires_grad]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        torch.distributed.all_reduce(flat)  # (N,) SUM
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad = g.view_as(p).clone()

    def sync_params_(self, module: torch.nn.Module) -> None:
        """Copy the main process's parameters and buffers into ``module`` on every process."""
        if not self.active:
            return
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                torch.distributed.broadcast(t.data, src=0)


_DIST: Dist | None = None
_SOLO = False  # the main process is running something alone (Dist.on_main)
_CLOSED = False  # shutdown closed a process group (leave)


def init_dist(device: str = "auto", shard: Any = None, zero: Any = None) -> Dist:
    """This process's place, set up once: one process unless a launcher set ``WORLD_SIZE`` > 1.

    ``device`` is ``model.device``: on CPU (or ``auto`` without CUDA) the processes talk over gloo. ``shard`` /
    ``zero``: the launch's FSDP or ZeRO plan (``rlft.parallel.launch`` reads them), which needs a process group
    even for one process.
    """
    global _DIST
    if _SOLO:
        return Dist()
    if _DIST is not None:
        return _DIST
    world, plan, zero_plan = int(os.environ.get("WORLD_SIZE", "1")), shard, zero
    if world <= 1 and plan is None and zero_plan is None:
        _cpu_simple_launcher()
        _DIST = Dist()
        return _DIST
    from accelerate import PartialState

    cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    state = PartialState(cpu=cpu, timeout=TIMEOUT)  # a process group even for one process: FSDP needs one
    _DIST = Dist(rank=state.process_index, world=state.num_processes, shard=plan, zero=zero_plan)
    return _DIST


def shutdown() -> None:
    """Wait for every process, then close the process group (left open, gloo can abort the exiting process)."""
    global _DIST, _CLOSED
    if _DIST is not None and (_DIST.active or _DIST.shard or _DIST.zero) and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
        _CLOSED = True
    _DIST = None


def leave(code: int) -> NoReturn:
    """End this process with ``code``. After ``shutdown`` closed a process group, the process leaves without the
    interpreter's teardown: there torch's C++ threads (gloo's, FSDP's and DeepSpeed's communication state) are
    destroyed as Python frees the last objects that hold them, and that aborted a finished run now and then
    ("terminate called without an active exception", signal 6; seen twice in the test suite's CI runs, once in an
    FSDP process and once after a DeepSpeed ZeRO-3 run, each after its last output). Everything is written and flushed
    first; a one-process run exits as usual."""
    if not _CLOSED:
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def set_up() -> bool:
    """Whether ``init_dist`` ran (and no ``shutdown`` since)."""
    return _DIST is not None


def solo() -> bool:
    """Whether the main process is running something alone (``Dist.on_main``)."""
    return _SOLO


def current() -> Dist:
    """The ``Dist`` of this process (one process until ``init_dist`` ran under a launcher)."""
    return _DIST if _DIST is not None and not _SOLO else Dist()


def env_flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether the launcher's setting ``name`` in ``env`` (default: this process's environment) is on: ``true``,
    ``1`` or ``yes`` in any case, as ``accelerate launch`` writes its flags."""
    return (os.environ if env is None else env).get(name, "").lower() in ("true", "1", "yes")


def _cpu_simple_launcher() -> None:
    """``accelerate launch --cpu --num_processes N`` (N > 1) starts ONE process: accelerate's CPU launcher spreads
    processes only through MPI, and sets MASTER_ADDR but no WORLD_SIZE. rlft then starts the N processes itself:
    it replaces this process with torch's launcher (``torch.distributed.run``) on the same command, before anything
    is written. Where N cannot be read from the launcher's command line, or this is not rlft's command, it stops
    instead of training alone while N processes were asked for."""
    from_accelerate = env_flag("ACCELERATE_USE_CPU")
    if not (from_accelerate and os.environ.get("MASTER_ADDR") and "WORLD_SIZE" not in os.environ):
        return
    n, entry = _launcher_processes(), _rlft_entry()
    if n > 1 and entry:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}",
               f"--master-addr={os.environ['MASTER_ADDR']}", f"--master-port={os.environ.get('MASTER_PORT', '29500')}",
               *entry, *sys.argv[1:]]
        print(f"rlft: accelerate's CPU launcher started one process for --num_processes {n}; starting {n} through "
              "torch.distributed.run", file=sys.stderr, flush=True)
        os.execv(sys.executable, cmd)
    raise RuntimeError(
        "accelerate launch --cpu with --num_processes > 1 started a single process (accelerate's CPU launcher "
        "needs an MPI hostfile for more), and rlft could not read the number of processes from its command line. "
        "Start the processes with torch's launcher instead: `accelerate launch --multi_gpu --num_processes N -m rlft "
        "train ...` (rlft uses gloo when there is no GPU) or `torchrun --nproc_per_node N -m rlft train ...`")


def _launcher_processes() -> int:
    """N of ``--num_processes N`` on the command line of this process's parent, the ``accelerate launch`` that
    started it (Linux); 0 when it is not there."""
    try:
        argv = [a.decode(errors="replace") for a in Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        return 0
    start = next((i + 1 for i, a in enumerate(argv) if a in ("launch", "accelerate.commands.launch")), None)
    if start is None:  # not `accelerate launch` nor `python -m accelerate.commands.launch`
        return 0
    argv = argv[start:]
    argv = argv[:argv.index("-m")] if "-m" in argv else argv  # the launcher's own arguments only
    for i, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if name.replace("-", "_") == "__num_processes":
            value = value or (argv[i + 1] if i + 1 < len(argv) else "")
            return int(value) if value.isdigit() else 0
    return 0


def _rlft_entry() -> list[str]:
    """How this process was started as rlft (``-m rlft`` or the ``rlft`` script), for the relaunch; [] otherwise."""
    main = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if main is None:
        return []
    if main.name == "__main__.py" and main.parent.name == "rlft":
        return ["-m", "rlft"]
    return [str(main)] if main.name == "rlft" else []
