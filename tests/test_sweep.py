"""``rlft sweep``: the grid's arguments, and a 2 values x 2 seeds sweep of the embedded default end to end."""

from __future__ import annotations

import json

import pytest

from rlft.cli.main import main
from rlft.config import ConfigError
from rlft.cli.sweep import parse_grid, point_name, split_top


def test_split_top_keeps_lists_and_quotes_whole():
    assert split_top("1e-4,3e-4") == ["1e-4", "3e-4"]
    assert split_top("[a,b]") == ["[a,b]"]
    assert split_top("[a,b],[c]") == ["[a,b]", "[c]"]
    assert split_top("{name: x, fn: 'f,g'}") == ["{name: x, fn: 'f,g'}"]


def test_parse_grid_separates_recipe_fixed_and_swept():
    recipe, fixed, swept = parse_grid(["r.yaml", "optim.lr=1e-4,3e-4", "reward.fns=[a,b]", "algo.group_size=4,8"])
    assert recipe == "r.yaml" and fixed == ["reward.fns=[a,b]"]
    assert swept == {"optim.lr": ["1e-4", "3e-4"], "algo.group_size": ["4", "8"]}
    with pytest.raises(ConfigError, match="nothing to sweep"):
        parse_grid(["optim.lr=1e-4"])
    with pytest.raises(ConfigError, match="empty value"):
        parse_grid(["optim.lr=1e-4,"])
    assert point_name({"optim.lr": "1e-4", "x.y": "[a b]"}, 1) == "lr=1e-4,y=_a_b_,seed=1"


def test_a_bad_value_fails_before_any_run(tmp_path, capsys):
    assert main(["sweep", "algo.group_size=4,0", f"log.run_dir={tmp_path}", "--name", "s"]) == 2
    assert "algo.group_size" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_sweep_two_values_two_seeds_writes_table_and_plot(tmp_path, tiny_overrides, capsys):
    args = [*tiny_overrides(tmp_path, "train.steps=2", "eval.every=1", "sft.steps=0", "train.threads=1"),
            "optim.lr=1e-3,1e-2"]
    assert main(["sweep", *args, "--seeds", "0", "1", "--name", "s"]) == 0
    root = tmp_path / "s"
    summary = json.loads((root / "sweep.json").read_text())
    assert [p["name"] for p in summary["points"]] == ["lr=1e-3,seed=0", "lr=1e-3,seed=1", "lr=1e-2,seed=0",
                                                      "lr=1e-2,seed=1"]
    assert all(p["status"] == "done" and 0 <= p["exact_match"] <= 1 for p in summary["points"])
    for row in summary["combinations"]:
        mine = [p for p in summary["points"] if p["values"] == row["values"]]
        assert row["runs"] == 2
        assert row["exact_match"] == pytest.approx(sum(p["exact_match"] for p in mine) / 2)
        assert row["best_val_exact_match"] is not None
    assert "| optim.lr | runs | exact match |" in (root / "sweep.md").read_text()
    assert (root / "plots" / "overview.png").is_file()
    out = capsys.readouterr().out
    assert "lr=1e-2,seed=1" in out
    assert main(["sweep", *args, "--seeds", "0", "1", "--name", "s"]) == 0  # finished points are not run again
    assert "sweep point" not in capsys.readouterr().out


def test_best_validation_reads_the_primary_set_only(tmp_path):
    """With eval.sets the metrics hold several val/<set>/exact_match series; the sweep compares the primary one."""
    from rlft.recipe import load_config
    from rlft.cli.sweep import _results

    cfg = load_config(None, ["eval.sets=[synthetic:chain]"])
    (tmp_path / "config.yaml").write_text(cfg.to_yaml())
    (tmp_path / "eval.json").write_text(json.dumps({"after_rl": {"exact_match": 0.5}}))
    rows = [{"step": 2, "val/max/exact_match": 0.25, "val/chain/exact_match": 0.9},
            {"step": 4, "val/max/exact_match": 0.5, "val/chain/exact_match": 0.75}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _results(tmp_path) == {"exact_match": 0.5, "best_val_exact_match": 0.5}
