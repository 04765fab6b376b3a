"""Weights & Biases: a run named after the run directory, its files in ``<run>/wandb/``.

Offline (``WANDB_MODE=offline``'s behaviour: nothing leaves the machine; ``wandb sync <run>/wandb/offline-run-*``
uploads it later) unless W&B is configured online here: ``WANDB_MODE`` set (then it decides), or credentials W&B
would use without asking, read without the network: ``WANDB_API_KEY``, ``WANDB_IDENTITY_TOKEN_FILE``, or a login
stored by ``wandb login`` in the netrc file (``NETRC``, else ``~/.netrc``) for W&B's host (``WANDB_BASE_URL``,
else api.wandb.ai). Then W&B's own settings decide (online by default; ``wandb offline`` keeps it offline).

The project is ``WANDB_PROJECT``, else ``rlft``. Each stream's metrics are plotted against its own step
(``define_metric(key, step_metric="step")``, ``sft/step``, ...). The final evaluation goes into the run's summary.
A resumed run continues the same W&B run (its id in trackers.json, ``resume="allow"``); offline, each start writes
its own ``offline-run-*`` directory with that id, which ``wandb sync`` uploads in order as one run.
"""

from __future__ import annotations

import netrc
import os
from urllib.parse import urlparse

import wandb

from rlft.runs.trackers.base import RunInfo, Stream, Tracker

PROJECT = "rlft"


def configured_online() -> bool:
    """Whether W&B has been set up here to decide its mode itself (see the module's docstring): ``WANDB_MODE``,
    an API key or identity token in the environment, or a stored login for its host. Reads no network."""
    if any(os.environ.get(k) for k in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE")):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or ""
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return os.path.isfile(path) and netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, run: RunInfo) -> None:
        super().__init__(run)
        saved = run.state.get("id") if run.resumed else None
        self.offline = not configured_online()
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or PROJECT, name=run.name, dir=str(run.dir),
            id=saved, resume="allow" if saved else None,
            mode="offline" if self.offline else None, reinit="create_new",
            settings=wandb.Settings(console="off", silent=True))
        self._run.config.update(run.params, allow_val_change=True)  # on resume, with the keys it changed
        self._defined: set[str] = set()

    def where(self) -> str:
        if self.offline:
            return f"offline, in {self.run.dir / 'wandb'} (upload it with: wandb sync {self._local_dir()})"
        return self._run.url or f"run {self._run.id}"

    def _local_dir(self) -> str:
        return os.path.dirname(self._run.dir.rstrip("/"))  # run.dir is <run>/wandb/offline-run-*/files

    def state(self) -> dict:
        return {"id": self._run.id}

    def log(self, stream: Stream, step: int, metrics: dict[str, float]) -> None:
        axis = stream.step_key
        for key in metrics.keys() - self._defined:
            if axis not in self._defined:
                self._run.define_metric(axis)
                self._defined.add(axis)
            self._run.define_metric(key, step_metric=axis)
            self._defined.add(key)
        self._run.log({**metrics, axis: step})

    def summary(self, values: dict[str, float]) -> None:
        self._run.summary.update(values)

    def close(self, failed: bool) -> None:
        self._run.finish(exit_code=1 if failed else 0)
