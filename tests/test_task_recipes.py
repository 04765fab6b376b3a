"""The task recipes beyond GSM8K run end to end on a tiny model: MBPP with the code reward, MATH with math +
think_format. Data comes from ../shared/data (skipped with a reason where it is absent)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from rlft.recipe import load_config
from rlft.rewards.pool import active_pool
from rlft.stages.pipeline import run_pipeline

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def need(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"{path} not found (../shared/data is only in the dev checkout)")
    return path


def run_recipe(recipe: str, data_dir: Path, tmp_path, tiny_model_dir, tiny_size_overrides, *extra: str):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    cfg = load_config(RECIPES / recipe, tiny_size_overrides(
        tmp_path / "runs", f"model.path={model_dir}", f"data.source={data_dir}", "model.dtype=float32",
        "data.template=raw", "data.num_eval=4", "data.max_prompt_tokens=1024", "train.micro_batch_size=4",
        "eval.batch_size=8", "eval.ks=[1,2]", "train.save_every=0", "train.steps=2", "reward.workers=1",
        "log.name=r", *extra))
    result = run_pipeline(cfg, echo=lambda *a, **k: None)
    records = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for rec in records:
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in rec.values())
        for key in cfg.reward.keys:
            assert rec[f"reward/{key}/errors"] == 0.0
    assert set(result.eval["after_rl"]) >= {"exact_match", "format_rate", "pass@1", "pass@2"}
    assert active_pool() is None  # the run's worker pool is closed
    return cfg, records


def test_grpo_mbpp_recipe(tmp_path, tiny_model_dir, tiny_size_overrides):
    from rlft.data.code_tasks import prepare_mbpp

    rows = [json.loads(x) for x in need(DATA / "mbpp" / "mbpp.jsonl").read_text().splitlines()]
    small = tmp_path / "mbpp.jsonl"
    small.write_text("\n".join(json.dumps(r) for r in rows if 11 <= r["task_id"] < 19 or 601 <= r["task_id"] < 609))
    prepare_mbpp(str(small), str(tmp_path / "mbpp"))
    cfg, records = run_recipe("grpo_mbpp.yaml", tmp_path / "mbpp", tmp_path, tiny_model_dir, tiny_size_overrides)
    assert cfg.reward.keys == ("code",) and cfg.eval.correct_fn == "code_pass"
    assert all(0.0 <= r["reward/code/mean"] <= 1.0 for r in records)


def test_grpo_math_recipe(tmp_path, tiny_model_dir, tiny_size_overrides):
    rows = [json.loads(x) for x in need(DATA / "math500" / "test.jsonl").read_text().splitlines()]
    data = tmp_path / "math"
    data.mkdir()
    for split, part in (("train", rows[:8]), ("test", rows[8:16])):
        (data / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in part) + "\n")
    cfg, records = run_recipe("grpo_math.yaml", data, tmp_path, tiny_model_dir, tiny_size_overrides,
                              "data.response_key=solution")  # the SFT warm-up imitates the worked solutions
    assert cfg.reward.keys == ("math", "think_format") and cfg.reward.resolved_weights == (1.0, 0.2)
    assert all(0.0 <= r["reward/think_format/mean"] <= 1.0 for r in records)
