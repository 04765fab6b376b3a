"""Every command of the tutorials (docs/tutorials/*.md) runs, at tiny size, and leaves the files the page names.

How a page is run, mechanically:

- its ```bash blocks, in order, are one bash script (``set -euo pipefail``), run in an empty temporary directory
  that holds a link ``recipes`` to the repository's recipes (the tutorials are followed from a clone's root);
- ``rlft`` and ``python`` on ``PATH`` are this interpreter; ``rlft train`` and ``rlft eval`` get the tiny size of
  the test suite (``conftest.TINY_SIZE``: a 1-layer model of 32 units, 3 SFT and 3 RL steps, 4 held-out problems,
  8 new tokens, no plots) appended to their arguments, so a tutorial's command runs as written, only smaller;
- the set-up lines (``SETUP``) are the one exception: they install the environment this test already runs in
  (``tests/test_setup_script.py`` tests ``scripts/setup.sh``), so they are checked to be exactly these lines and
  not run;
- after the script exits 0, every backticked path under ``runs/`` or ``data/`` that the page names must exist, and
  every metric the runs logged (``*metrics.jsonl``) must have its definition (``rlft.insight.metric_defs``,
  the table docs/reference/metrics.md is generated from).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY_SIZE
from rlft.insight.metric_defs import definition

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs" / "tutorials").glob("*.md"))
SETUP = ("bash scripts/setup.sh", "source .venv/bin/activate")
FENCE = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
PATH_REF = re.compile(r"`((?:runs|data)/[^`\s]+)`")
TINY = list(TINY_SIZE)


def commands(text: str) -> str:
    """The page's bash blocks as one script, the set-up lines left out (they must be exactly ``SETUP``)."""
    out = []
    for block in FENCE.findall(text):
        for line in block.splitlines():
            if line.strip() in SETUP:
                continue
            assert not line.lstrip().startswith(("bash scripts/", "source ")), f"set-up line not in SETUP: {line}"
            out.append(line)
    return "\n".join(out) + "\n"


def named_paths(text: str) -> list[str]:
    """The backticked ``runs/...`` and ``data/...`` paths of ``text`` (placeholders like ``<name>`` left out)."""
    return sorted({p for p in PATH_REF.findall(text) if "<" not in p and "*" not in p})


def shims(bin_dir: Path) -> None:
    """``rlft`` (tiny size appended to train and eval) and ``python`` for the page's script."""
    bin_dir.mkdir()
    tiny = " ".join(shlex.quote(a) for a in TINY)
    py = shlex.quote(sys.executable)
    scripts = {
        "rlft": f'#!/bin/sh\ncase "$1" in\n  train|eval) exec {py} -m rlft "$@" {tiny} ;;\n'
                f'  *) exec {py} -m rlft "$@" ;;\nesac\n',
        "python": f'#!/bin/sh\nexec {py} "$@"\n',
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_page(page: Path, work: Path) -> subprocess.CompletedProcess:
    shims(work / "bin")
    cwd = work / "tutorial"
    cwd.mkdir()
    (cwd / "recipes").symlink_to(ROOT / "recipes")
    env = {**os.environ, "PATH": f"{work / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
           "RLFT_TEST_THREADS": "1", "OMP_NUM_THREADS": "1"}
    script = "set -euo pipefail\n" + commands(page.read_text(encoding="utf-8"))
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_there_are_tutorials_and_each_has_commands():
    assert {p.name for p in PAGES} >= {"demo.md", "your-data.md", "agent.md"}
    for page in PAGES:
        assert "rlft train" in commands(page.read_text(encoding="utf-8")), page.name


def test_commands_keep_heredocs_and_drop_only_the_set_up():
    text = ("intro\n```bash\nbash scripts/setup.sh\nsource .venv/bin/activate\n```\n"
            "```bash\ncat > r.py <<'EOF'\nx = 1\nEOF\nrlft train log.name=a\n```\n```yaml\nnot: run\n```\n")
    assert commands(text) == "cat > r.py <<'EOF'\nx = 1\nEOF\nrlft train log.name=a\n"
    with pytest.raises(AssertionError, match="set-up line"):
        commands("```bash\nbash scripts/setup.sh --gpu\n```\n")
    assert named_paths("`runs/a/eval.json`, `runs/<name>/policy`, `data/x/`, `recipes/y.yaml`") == [
        "data/x/", "runs/a/eval.json"]


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_every_command_of_the_tutorial_runs_at_tiny_size(page, tmp_path):
    result = run_page(page, tmp_path)
    assert result.returncode == 0, f"{page.name}: exit {result.returncode}\n{result.stdout[-3000:]}\n" \
                                   f"{result.stderr[-3000:]}"
    cwd = tmp_path / "tutorial"
    missing = [p for p in named_paths(page.read_text(encoding="utf-8")) if not (cwd / p).exists()]
    assert missing == [], f"{page.name} names files its commands did not write: {missing}"
    logged = {key for path in cwd.glob("runs/**/*metrics.jsonl")
              for line in path.read_text(encoding="utf-8").splitlines() for key in json.loads(line)}
    assert "reward/mean" in logged, f"{page.name}: no RL metrics logged"
    assert sorted(k for k in logged if definition(k) is None) == [], f"{page.name}: metrics without a definition"
