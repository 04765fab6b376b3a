"""``train.resume`` loads ``state.pt`` with ``weights_only=True``: a run's own checkpoint resumes (also one written
before the numpy RNG key was stored as a list), and a planted one whose unpickling would run code is refused
with a message naming it, before anything in it runs."""

from __future__ import annotations

import os
import pickle
import shutil
import uuid

import numpy as np
import pytest
import torch

from rlft.runs import checkpoint
from rlft.cli.main import main
from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.stages.pipeline import run_pipeline

COMMON = ("log.name=r", "train.save_every=1", "sft.steps=0", "eval.before_rl=false", "eval.ks=[]")


def quiet(*args, **kwargs) -> None:
    pass


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_overrides):
    """A two-step tiny run with a checkpoint at step 1 (the last step writes the final policy instead)."""
    root = tmp_path_factory.mktemp("runs")
    run_pipeline(load_config(None, tiny_overrides(root, *COMMON, "train.steps=2")), echo=quiet)
    return root


@pytest.fixture
def run_copy(finished_run, tmp_path):
    """A copy of the finished run's directory under ``tmp_path`` (``log.run_dir``), and its ``state.pt``."""
    shutil.copytree(finished_run / "r", tmp_path / "r")
    return tmp_path, tmp_path / "r" / "checkpoints" / "step_000001" / "state.pt"


def resume(run_dir, tiny_overrides, lines: list[str] | None = None):
    """``train.resume=true`` on the run under ``run_dir``, one more step than it ran."""
    cfg = load_config(None, tiny_overrides(run_dir, *COMMON, "train.steps=3", "train.resume=true"))
    return run_pipeline(cfg, echo=(lines.append if lines is not None else quiet))


def test_a_runs_own_checkpoint_resumes(run_copy, tiny_overrides):
    """The checkpoint needs nothing beyond tensors and plain types, and train.resume continues from it."""
    run_dir, state = run_copy
    if hasattr(torch.serialization, "get_unsafe_globals_in_checkpoint"):
        assert torch.serialization.get_unsafe_globals_in_checkpoint(state) == []
    assert isinstance(checkpoint.load_state(state.parent)["rng"]["numpy"][1], list)
    lines: list[str] = []
    resume(run_dir, tiny_overrides, lines)
    assert any("resumed from" in line and "step_000001" in line for line in lines)


def test_a_checkpoint_with_the_older_numpy_rng_array_still_resumes(run_copy, tiny_overrides):
    """A state.pt written before the numpy key was a list (a uint32 array) loads and restores that state."""
    if not hasattr(torch.serialization, "safe_globals"):
        pytest.skip("torch < 2.5 has no allowlist: such a checkpoint is refused instead")
    run_dir, state = run_copy
    saved = torch.load(state, weights_only=False)  # written by this test just above: trusted
    np.random.seed(123)
    old = np.random.get_state()
    for rng in [saved["rng"], *(saved["process_rngs"] or [])]:  # as an older rlft wrote them
        rng["numpy"] = old
    torch.save(saved, state)
    (state.parent / checkpoint.MANIFEST).unlink()  # an older rlft wrote none
    assert isinstance(checkpoint.load_state(state.parent)["rng"]["numpy"][1], np.ndarray)
    np.random.seed(0)
    checkpoint.set_rng_state(checkpoint.load_state(state.parent)["rng"])
    assert np.array_equal(np.random.get_state()[1], old[1])
    lines: list[str] = []
    resume(run_dir, tiny_overrides, lines)
    assert any("resumed from" in line for line in lines)


class RunsCode:
    """Unpickling it would call ``call(*args)``."""

    def __init__(self, call, *args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


def plant(state, how: str, marker) -> None:
    """Overwrite ``state`` with a pickle whose loading would create ``marker``: through os.system or a builtin,
    written by torch.save or as a bare pickle (protocol 2 as torch's own, or 4)."""
    payload = RunsCode(os.system, f"touch {marker}") if how.startswith("system") else \
        RunsCode(exec, f"open({str(marker)!r}, 'w').close()")
    if "pickle" in how:
        state.write_bytes(pickle.dumps({"trainer": payload}, protocol=4 if how.endswith("4") else 2))
    else:
        torch.save({"optimizer": {}, "rng": payload, "trainer": {}}, state)
    checkpoint.write_manifest(state.parent)  # the checksum is no defence: whoever plants the file can write it too


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4:UserWarning")  # torch's, on the bare pickle
@pytest.mark.parametrize("how", ["system", "exec", "system_pickle", "exec_pickle4"])
def test_a_planted_state_that_would_run_code_is_refused_and_nothing_runs(run_copy, tiny_overrides, how):
    """train.resume refuses it with a ConfigError naming the file (and, where torch can tell, what it would
    call); the marker its code would write is absent."""
    run_dir, state = run_copy
    marker = run_dir / f"ran-{uuid.uuid4().hex}"
    plant(state, how, marker)
    with pytest.raises(ConfigError) as err:
        resume(run_dir, tiny_overrides)
    message = str(err.value)
    assert message.startswith("train.resume: ") and str(state) in message
    assert "would need unsafe unpickling" in message and "was not loaded" in message
    if not how.endswith("4"):  # torch's reader stops at protocol 4's first frame, before the call's name
        assert ("system" if how.startswith("system") else "exec") in message
    assert "add_safe_globals" not in message  # torch's advice to allow it is not passed on
    assert not marker.exists()


def test_the_cli_reports_a_planted_state_as_an_error(run_copy, tiny_overrides, capsys):
    """``rlft train ... train.resume=true``: exit code 2 and the message, no traceback, nothing run."""
    run_dir, state = run_copy
    marker = run_dir / f"ran-{uuid.uuid4().hex}"
    plant(state, "system", marker)
    code = main(["train", *tiny_overrides(run_dir, *COMMON, "train.steps=3", "train.resume=true")])
    err = capsys.readouterr().err
    assert code == 2 and "rlft: error: train.resume: " in err and "unsafe unpickling" in err
    assert "Traceback" not in err and not marker.exists()
