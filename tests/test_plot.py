"""``rlft plot``: the curves drawn are the runs' logged metrics; PNG files are written and readable."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("matplotlib", reason="rlft plot needs the plot extra (matplotlib)")

import matplotlib.image as mpimg  # noqa: E402

from rlft.cli.main import main  # noqa: E402
from rlft.insight.plot import plot_runs  # noqa: E402


def write_run(path, steps, offset=0.0, val_every=2, kl_key="actor/kl_loss"):
    path.mkdir(parents=True)
    lines = []
    for s in range(1, steps + 1):
        r = {"step": s, "reward/mean": 0.1 * s + offset, kl_key: 0.01 * s, "actor/entropy": 1.0 / s,
             "response_length/mean": 8.0 + s, "actor/grad_norm": 2.0, "timing_s/rollout": 0.5,
             "timing_s/update": 0.25}
        if s % val_every == 0:
            r["val/max/exact_match"] = 0.3 + 0.01 * s
        lines.append(json.dumps(r))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_plot_draws_each_runs_metrics_overlaid(tmp_path):
    write_run(tmp_path / "a", 6)
    write_run(tmp_path / "p" / "1-grpo", 4, offset=1.0, kl_key="actor/reward_kl_penalty")  # a pipeline's RL stage
    drawn = plot_runs([tmp_path / "a", tmp_path / "p"], tmp_path / "out")
    assert drawn["reward"]["a"] == ([1, 2, 3, 4, 5, 6], pytest.approx([0.1 * s for s in range(1, 7)]))
    assert drawn["reward"]["p/1-grpo"][1] == pytest.approx([1.0 + 0.1 * s for s in range(1, 5)])
    assert drawn["validation"]["a"] == ([2, 4, 6], pytest.approx([0.32, 0.34, 0.36]))
    assert drawn["kl"]["p/1-grpo"][1] == pytest.approx([0.01 * s for s in range(1, 5)])  # KL in the reward
    assert set(drawn["timing"]) == {"a: timing_s/rollout", "a: timing_s/update", "p/1-grpo: timing_s/rollout",
                                    "p/1-grpo: timing_s/update"}
    for name in [*drawn, "overview"]:
        image = mpimg.imread(tmp_path / "out" / f"{name}.png")
        assert image.ndim == 3 and image.shape[0] > 100 and image.std() > 0, name


def test_plot_command_and_its_errors(tmp_path, capsys):
    write_run(tmp_path / "a", 3)
    assert main(["plot", str(tmp_path / "a")]) == 0
    assert "overview.png" in capsys.readouterr().out and (tmp_path / "a" / "plots" / "reward.png").is_file()
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "metrics.jsonl").write_text('{"step": 1}\n{bad\n{"step": 2}\n')
    assert main(["plot", str(tmp_path / "b")]) == 2
    assert "line 2: not JSON" in capsys.readouterr().err


def test_a_run_with_validation_writes_its_curves_report_and_plots(tmp_path, tiny_overrides):
    """Issue 13's acceptance on the embedded demo's settings: eval.every gives validation curves, and the run ends
    with report.html and plots/*.png (log.plots) without any other command."""
    from rlft.recipe import load_config
    from rlft.stages.pipeline import run_pipeline

    cfg = load_config(None, tiny_overrides(tmp_path, "train.steps=4", "eval.every=2", "log.plots=true", "log.name=v"))
    res = run_pipeline(cfg, echo=lambda *a, **k: None)
    steps = [json.loads(line) for line in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "val/max/exact_match" in r] == [2, 4]
    assert (res.run_dir / "report.html").is_file()
    for name in ("reward", "validation", "overview"):
        image = mpimg.imread(res.run_dir / "plots" / f"{name}.png")
        assert image.ndim == 3 and image.std() > 0, name


def test_without_matplotlib_a_run_says_how_to_get_plots(tmp_path, monkeypatch):
    import sys

    from rlft.insight.plot import write_run_plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    said = []
    assert write_run_plots(tmp_path, echo=said.append) is None
    assert "pip install 'rlft[plot]'" in said[0] and not (tmp_path / "plots").exists()
