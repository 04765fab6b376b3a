"""``report.html`` opens with what ran (from config.yaml, the logs and run.json) and defines every metric it shows:
each metric a run logs has a definition (``rlft.insight.metric_defs``), the page holds it, and its tables link to it."""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import rlft
from rlft.cli.main import main
from rlft.insight.metric_defs import anchor, definition
from rlft.insight.report import _flat
from rlft.recipe import load_config
from rlft.insight.report import build_report
from rlft.runs.console import STARTED_BY, command_line
from rlft.runs.start import record_end, record_start
from rlft.stages.pipeline import run_pipeline

REPO = Path(__file__).resolve().parents[1]


def _what_ran(page: str) -> dict[str, str]:
    """The opening table's rows, {what: value}; it must come right after the title."""
    body = page[page.index("<body>"):]
    assert re.match(r'<body>\s*<h1>[^<]*</h1>\s*<table id="what-ran">', body), body[:300]
    table = body[body.index('<table id="what-ran">'):body.index("</table>")]
    return {k: html.unescape(v) for k, v in re.findall(r"<tr><td>([^<]*)</td><td[^>]*>([^<]*)</td></tr>", table)}


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory, tiny_overrides):
    """A tiny run started as `python -m rlft train ...` (a real process, as a user starts one)."""
    tmp = tmp_path_factory.mktemp("cli_run")
    args = ["train", *tiny_overrides(tmp, "log.name=r", "train.steps=2", "eval.every=1", "log.samples_every=1")]
    done = subprocess.run([sys.executable, "-m", "rlft", *args], capture_output=True, text=True, cwd=tmp,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "r", args


def test_the_report_opens_with_what_ran(cli_run):
    run, args = cli_run
    record = json.loads((run / "run.json").read_text())["starts"]
    command = shlex.join(["python", "-m", "rlft", *args])
    assert len(record) == 1 and record[0]["command"] == command
    assert record[0]["rlft_version"] == rlft.__version__ and record[0]["seconds"] > 0
    rows = _what_ran((run / "report.html").read_text())
    assert rows["algorithm"] == "sft -> grpo" and record[0]["stages"] == ["sft", "grpo"]  # the warm-up, then RL
    assert rows["model"] == "the embedded tiny model (32 hidden, 1 layer)"
    assert rows["data"] == "synthetic:max"
    assert rows["steps"] == "rl: 2; sft: 3 (configured: sft.steps = 3, train.steps = 2)"
    assert rows["wall time"] == f"{record[0]['seconds']:.1f} s"
    assert rows["rlft version"] == rlft.__version__
    assert rows["command"] == command and rows["started"] == record[0]["started"]
    assert (run / "run.log").read_text().splitlines()[0].endswith(f" {command}")  # run.log's first line too


def test_every_metric_the_run_logged_is_defined_in_its_report(cli_run):
    run, _ = cli_run
    page = (run / "report.html").read_text()
    logged = {k for name in ("metrics.jsonl", "sft_metrics.jsonl")
              for line in (run / name).read_text().splitlines() for k in json.loads(line)}
    logged |= {k for part in json.loads((run / "eval.json").read_text()).values() for k in _flat(part)}
    assert {"reward/mean", "val/max/exact_match", "sft/loss", "exact_match", "pass@2"} <= logged
    missing = sorted(k for k in logged if definition(k) is None)
    assert not missing, f"metrics without a definition in rlft/insight/metric_table.py: {missing}"
    ids = set(re.findall(r'id="([^"]+)"', page))
    assert {anchor(definition(k)[0]) for k in logged} <= ids  # the page defines each
    links = re.findall(r'href="#([^"]+)"', page)
    assert links and set(links) <= ids  # every link lands on a definition in the page
    table = page[page.index('<table id="evaluation">'):]
    table = table[:table.index("</table>")]
    assert '<a href="#metric-val-set-exact-match">exact_match</a>' in table
    assert '<a href="#metric-val-set-pass-k">pass@2</a>' in table
    assert '<dt id="metric-val-set-exact-match"><code>val/&lt;set&gt;/exact_match</code></dt>' in page
    assert "the weighted sum of the reward entries. TRL&#x27;s <code>reward</code>" in page  # code spans as code
    fired = json.loads((run / "health.json").read_text())
    for rule in fired:  # the health table's rules link to health/<rule>
        assert f'<a href="#{anchor("health/<rule>")}">{rule}</a>' in page


def test_the_python_api_records_how_it_was_called(tmp_path, tiny_overrides):
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=api", "train.steps=1", "sft.steps=1",
                                           "eval.before_rl=false"))
    token = STARTED_BY.set("rlft.train(recipe=None, overrides={'train.steps': 1})")
    try:
        run = run_pipeline(cfg, echo=lambda *a, **k: None).run_dir
    finally:
        STARTED_BY.reset(token)
    rows = _what_ran((run / "report.html").read_text())
    assert rows["command"] == "rlft.train(recipe=None, overrides={'train.steps': 1})"
    assert rows["algorithm"] == "sft -> grpo"
    record_start(run, command_line(), ["grpo"])  # a second start (resumed), no caller saying how: the program
    starts = json.loads((run / "run.json").read_text())["starts"]
    assert len(starts) == 2 and starts[1]["command"] == f"rlft.train(...) in python {shlex.join(sys.argv)}"
    build_report(run)
    assert _what_ran((run / "report.html").read_text())["wall time"] == \
        f"{starts[0]['seconds']:.1f} s over 2 starts (running, or stopped before its end)"
    record_end(run, 2.0)
    build_report(run)
    wall = _what_ran((run / "report.html").read_text())["wall time"]
    assert wall == f"{starts[0]['seconds'] + 2:.1f} s over 2 starts"


def test_a_run_without_run_json_shows_the_command_of_its_log(tmp_path):
    (tmp_path / "config.yaml").write_text("algo: {name: dapo}\nmodel: {path: /models/q}\ndata: {source: d.jsonl}\n")
    (tmp_path / "run.log").write_text("# 2026-01-02 03:04:05 rlft train r.yaml\nrlft: ...\n")
    assert main(["report", str(tmp_path)]) == 0
    rows = _what_ran((tmp_path / "report.html").read_text())
    assert rows["command"] == "rlft train r.yaml" and rows["algorithm"] == "dapo" and rows["model"] == "/models/q"
    assert rows["steps"].startswith("none logged yet") and rows["wall time"] == "-"


def test_a_single_stage_says_which(tmp_path, tiny_overrides):
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=s", "sft.steps=1"))
    run = run_pipeline(cfg, echo=lambda *a, **k: None, only="sft").run_dir
    assert json.loads((run / "run.json").read_text())["starts"][0]["stages"] == ["sft"]
    rows = _what_ran((run / "report.html").read_text())
    assert rows["algorithm"] == "sft" and rows["command"].startswith("rlft.sft(...) in python ")
