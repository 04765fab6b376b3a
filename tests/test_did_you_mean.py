"""An unknown configuration key names the closest known ones ("did you mean"), in a recipe and on the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.recipe.parse import unknown_key

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("override, hint", [
    ("train.step=2", "did you mean train.steps?"),  # a typo inside the section
    ("algo.clip_hihg=0.3", "did you mean algo.clip_high?"),
    ("rollout.temprature=0.7", "did you mean rollout.temperature?"),
    ("algo.lr=1e-5", "did you mean optim.lr or "),  # the key lives in another section: the main one first
    ("rollout.group_size=4", "did you mean algo.group_size?"),
    ("algo.temperature=0.7", "did you mean rollout.temperature or eval.temperature?"),
    ("trian.steps=2", "trian: unknown key; did you mean train?"),  # a misspelt section
    ("lr=1e-5", "lr: unknown key; did you mean optim.lr or "),  # a section's key without its section
    ("eval.sets=[{source: x.jsonl, correct: math}]", "did you mean eval.sets[0].correct_fn?"),  # a list's entry
])
def test_an_unknown_key_names_the_closest(override, hint):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert hint in str(e.value)
    assert "allowed" in str(e.value)  # and still what the section allows


def test_nothing_close_is_no_guess():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.zzzz=1"])
    assert "did you mean" not in str(e.value) and "allowed in train: " in str(e.value)


def test_the_message_names_the_section_it_lists():
    text = unknown_key("step", "train.", ["seed", "steps"])
    assert text == "unknown key; did you mean train.steps? allowed in train: seed, steps"


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlft", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}, timeout=300)


def test_a_recipe_and_an_override_get_the_hint_from_the_command(tmp_path):
    """A typo in a recipe file and one on the command line: one line naming the key and the closest, exit 2,
    no run directory."""
    recipe = tmp_path / "typo.yaml"
    recipe.write_text("train:\n  step: 2\n")
    done = _cli(tmp_path, "train", str(recipe), "log.name=x")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("rlft: error: train.step: unknown key; did you mean train.steps?")
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    done = _cli(tmp_path, "sft", "algo.lr=1e-4", "log.name=x")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("rlft: error: algo.lr: unknown key; did you mean optim.lr")
    assert not (tmp_path / "runs").exists()
