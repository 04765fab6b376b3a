"""benchmarks/preset_table.py's rl_once, the run-once rule every table of RL runs (preset, sampler, judge) keeps:
a finished run is read back, an unfinished one is set aside and never overwritten, a failure is returned."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _preset_table():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_preset_table", BENCH / "preset_table.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_rl_once_runs_what_is_missing_keeps_what_finished_and_sets_aside_what_did_not(tmp_path, monkeypatch):
    pt = _preset_table()
    calls = []

    def fake_rlft(args, threads, command="train"):
        calls.append(args)
        name = next(a for a in args if a.startswith("log.name=")).split("=", 1)[1]
        if "fail" in name:
            raise RuntimeError("rlft train failed:\nboom")
        (tmp_path / name).mkdir()
        (tmp_path / name / "eval.json").write_text(json.dumps({"after_rl": {"exact_match": 0.5}}))

    monkeypatch.setattr(pt, "rlft", fake_rlft)
    assert pt.rl_once(tmp_path, "a", ["x=1"], 1) is None
    assert calls == [["x=1", f"log.run_dir={tmp_path}", "log.name=a"]]
    assert pt.rl_once(tmp_path, "a", ["x=1"], 1) is None and len(calls) == 1  # finished: read back, not re-run

    (tmp_path / "b").mkdir()  # an attempt that died before its after-RL evaluation
    (tmp_path / "b" / "eval.json").write_text(json.dumps({"before_rl": {}}))
    (tmp_path / "b" / "metrics.jsonl").write_text("{}\n")
    assert pt.rl_once(tmp_path, "b", [], 1) is None
    assert (tmp_path / "b.failed-0" / "metrics.jsonl").read_text() == "{}\n"
    assert "after_rl" in json.loads((tmp_path / "b" / "eval.json").read_text())

    error = pt.rl_once(tmp_path, "fail", [], 1)
    assert error.endswith("boom") and not (tmp_path / "fail").exists()
