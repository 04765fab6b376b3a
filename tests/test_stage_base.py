"""The stages' shared step log: one JSON line per step (counted from 1) and, when asked, a progress bar."""

from __future__ import annotations

import json

from rlft.stages.base import step_log


def test_step_log_writes_steps_and_shows_a_bar(tmp_path, capsys):
    with step_log(tmp_path, "sft_metrics.jsonl", total=2, show=True) as on_step:
        on_step(0, {"sft/loss": 1.5})
        on_step(1, {"sft/loss": 0.25})
    rows = [json.loads(x) for x in (tmp_path / "sft_metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["sft/loss"]) for r in rows] == [(1, 1.5), (2, 0.25)]
    err = capsys.readouterr().err
    assert "sft: 100%" in err and "2/2" in err and "loss=0.250" in err


def test_step_log_without_a_bar_prints_nothing(tmp_path, capsys):
    with step_log(tmp_path, "rm_metrics.jsonl", total=1) as on_step:
        on_step(0, {"rm/loss": 0.5})
    assert capsys.readouterr().err == ""
