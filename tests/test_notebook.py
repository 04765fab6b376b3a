"""examples/quickstart.ipynb runs from top to bottom (nbclient, a kernel of this interpreter), at its small sizes,
and is kept in the repository with its outputs cleared."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"
REPO = NOTEBOOK.parents[1]


def test_the_quickstart_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_the_quickstart_notebook_runs(tmp_path, monkeypatch):
    """Executed in a scratch directory (its runs/ land there) by a kernel of this very interpreter (a kernelspec
    written for the test, found through JUPYTER_PATH, so no kernel need be installed), which imports the rlft of
    this checkout (PYTHONPATH)."""
    spec = tmp_path / "jupyter" / "kernels" / "rlft-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "rlft test", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="rlft-test", timeout=300,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # a cell that raises fails here, with its traceback
    runs = sorted((tmp_path / "runs").iterdir(), key=lambda p: p.name == "trl-quickstart")
    assert [r.name for r in runs][1:] == ["trl-quickstart"]  # the API's run (a timestamp), then the TRL script's
    assert (runs[0] / "policy" / "config.json").is_file() and (runs[0] / "data").is_dir()
    assert (runs[1] / "final" / "config.json").is_file() and (runs[1] / "metrics.jsonl").is_file()
    shown = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                    for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "exact match before and after RL" in shown and "'pass@1'" in shown
    assert "LlamaForCausalLM" in shown  # the TRL script's saved model, loaded back by transformers
