"""The README's quick start states the demo's result as measured with exactly the command it shows.

The measurement (docs/data/readme_demo.json: what ``bash scripts/demo.sh`` printed, when, where, and the run's
main settings) is checked against the README's sentence and against today's defaults: a change of the defaults
the demo runs with makes the stated result stale, and this test says so (measure again, update both)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rlft.recipe import load_config

REPO = Path(__file__).resolve().parents[1]
RECORD = json.loads((REPO / "docs" / "data" / "readme_demo.json").read_text())


def _quick_start() -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index("## Quick start")
    return readme[start:readme.index("\n## ", start + 1)]


def test_the_quick_start_shows_the_command_that_was_measured():
    section = _quick_start()
    commands = [line.split("#")[0].strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)
                for line in block.splitlines()]
    assert RECORD["command"] == "bash scripts/demo.sh" and RECORD["command"] in commands
    assert (REPO / "scripts" / "demo.sh").read_text().rstrip().endswith('.venv/bin/rlft train "$@"')  # no settings


def test_the_quick_start_states_what_the_command_printed():
    section = " ".join(_quick_start().split())
    before, after = RECORD["exact_match"]["before_rl"], RECORD["exact_match"]["after_rl"]
    printed = RECORD["printed"]
    assert f"exact_match                  {before:.3f}       {after:.3f}" in printed
    assert f"time                  {RECORD['rlft_time_s']} s" in printed
    assert f"held-out problems     {RECORD['held_out']}" in printed
    assert f"Measured with exactly `{RECORD['command']}` from a clean clone on {RECORD['date']}" in section
    assert f"greedy exact match {before:.3f} before RL and {after:.3f} after (+{(after - before) * 100:.1f} points" \
        in section
    assert f"on {RECORD['held_out']} held-out problems and `time {RECORD['rlft_time_s']} s`" in section
    assert f"after {RECORD['setup_s']} s of set-up" in section


def test_the_measurement_used_todays_defaults():
    cfg = load_config()
    for key, value in RECORD["config"].items():
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) == value, (
            f"{key} is now {getattr(getattr(cfg, section), name)!r}, the README's demo result was measured with "
            f"{value!r}: run `bash scripts/demo.sh` again and update README.md and docs/data/readme_demo.json")
