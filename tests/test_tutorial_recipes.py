"""The SFT-vs-RL tutorial's two comparisons as recipes (recipes/sft_vs_rl_tutorial.yaml and sft_vs_rl_rewards.yaml),
each side of each run end to end at tiny size on GSM8K rows prepared in the XML layout (``rlft prepare gsm8k_xml``),
and that preparation itself. GSM8K comes from ../shared/data (skipped with a reason where it is absent)."""

from __future__ import annotations

import json
import math
import shutil

import pyarrow.parquet as pq
import pytest

from conftest import RECIPES
from rlft.cli.main import main
from rlft.data.gsm8k import XML_INSTRUCTION, prepare_xml, to_verl_row, xml_response
from rlft.data.loaders import load_examples
from rlft.recipe import load_config
from rlft.rewards.cor import CorReward
from rlft.rewards.formats import AnswerTag, XmlFormat
from rlft.stages.pipeline import run_pipeline


def quiet(*args, **kwargs) -> None:
    pass


def test_xml_response_is_formatted_and_right():
    answer = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72.\n#### 1,072"
    text = xml_response(answer)
    assert text.startswith("<reasoning>\nNatalia sold") and "####" not in text
    truth = {"ground_truth": "1072"}
    assert XmlFormat("tutorial")(text, {}) == XmlFormat("strict")(text, {}) == 1.0
    assert AnswerTag("first_string")(text, truth) == AnswerTag()(text, truth) == 1.0
    assert CorReward()([text], [truth]) == [2.0]
    row = to_verl_row("How many?", answer, "train", 3, "xml")
    assert row["prompt"][0]["content"] == "How many? " + XML_INSTRUCTION and row["extra_info"]["answer"] == text
    assert to_verl_row("How many?", answer, "train", 3)["extra_info"]["answer"] == answer  # the default layout
    with pytest.raises(ValueError, match="^layout: must be one of hash, xml, got 'json'"):
        to_verl_row("How many?", answer, "train", 3, "json")


def test_prepare_gsm8k_xml_on_real_rows(gsm8k_raw_small, tmp_path, capsys):
    assert main(["prepare", "gsm8k_xml", "--input", str(gsm8k_raw_small), "--output", str(tmp_path / "xml")]) == 0
    out = capsys.readouterr().out
    for split in ("train", "test"):
        path = tmp_path / "xml" / f"{split}.parquet"
        assert f"{split}: {path}" in out and pq.read_table(path).num_rows == 16
    examples = load_examples(str(tmp_path / "xml"), "train")
    for ex in examples:  # every reference response is formatted and scores full marks with every reading
        sample = ex.to_mapping()
        assert XmlFormat()(ex.response, sample) == 1.0
        assert AnswerTag("first_string")(ex.response, sample) == 1.0
        assert CorReward()([ex.response], [sample]) == [2.0]


SIDES = [  # each comparison's two sides, as its header's `rlft sweep` line gives them
    ("sft_vs_rl_tutorial.yaml", "stages=[grpo]", ["grpo"]),
    ("sft_vs_rl_tutorial.yaml", "stages=[sft,grpo]", ["sft", "grpo"]),
    ("sft_vs_rl_rewards.yaml", "reward.weights=[1,0,1]", ["sft", "grpo"]),
    ("sft_vs_rl_rewards.yaml", "reward.weights=[0,1,1]", ["sft", "grpo"]),
]


@pytest.mark.parametrize("recipe, side, stages", SIDES, ids=[f"{r}:{s}" for r, s, _ in SIDES])
def test_each_side_runs_at_tiny_size(tmp_path, gsm8k_raw_small, tiny_model_dir, tiny_size_overrides, recipe, side,
                                     stages):
    prepare_xml(str(gsm8k_raw_small), str(tmp_path / "gsm8k_xml"))
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    cfg = load_config(RECIPES / recipe, tiny_size_overrides(
        tmp_path / "runs", f"model.path={model_dir}", f"data.source={tmp_path / 'gsm8k_xml'}", "data.template=raw",
        "data.max_prompt_tokens=1024", "sft.steps=2", "sft.batch_size=4", "train.steps=2", "eval.batch_size=8",
        "log.name=r", side))
    result = run_pipeline(cfg, echo=quiet)
    assert [e["stage"] for e in result.stages] == stages
    [metrics] = list(result.run_dir.rglob("metrics.jsonl"))
    records = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for rec in records:
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in rec.values())
        for key in cfg.reward.keys:  # every term, trained on or only logged, scored every sample
            assert rec[f"reward/{key}/errors"] == 0.0 and math.isfinite(rec[f"reward/{key}/mean"])
    assert set(result.eval["after_rl"]) >= {"exact_match", "format_rate", "pass@1", "pass@2"}


def test_the_reward_recipe_holds_both_sets():
    cfg = load_config(RECIPES / "sft_vs_rl_rewards.yaml", ["model.path=/m"])
    assert cfg.reward.keys == ("cor_as_written", "cor_improved", "xml_format")
    assert cfg.reward.resolved_weights == (1.0, 0.0, 1.0)
    params = {t.key: dict(t.params) for t in cfg.reward.fns}
    assert params["cor_as_written"] == {"reading": "group"}
    assert params["cor_improved"]["confidence"] is True and params["cor_improved"]["reading"] == "combined"
    tutorial = load_config(RECIPES / "sft_vs_rl_tutorial.yaml", ["model.path=/m"])
    assert tutorial.stages == ("sft", "grpo") and tutorial.reward.keys == ("cor_reward", "xml_format")


DEMO_SIDES = ["stages=[grpo]", "stages=[sft,grpo]", "reward.weights=[0,1,0,1]", "reward.weights=[0,0,1,1]"]


@pytest.mark.parametrize("side", DEMO_SIDES)
def test_each_side_of_the_embedded_comparisons_runs(tmp_path, tiny_size_overrides, side):
    """recipes/sft_vs_rl_demo.yaml, the two comparisons on the embedded task (no data needed): each side of its
    header's sweeps trains on its own term and logs all four, every one scoring every sample."""
    cfg = load_config(RECIPES / "sft_vs_rl_demo.yaml", tiny_size_overrides(
        tmp_path / "runs", "sft.steps=2", "train.steps=2", "log.name=r", side))
    assert cfg.reward.keys == ("cor_completion", "cor_as_written", "cor_improved", "format_final")
    result = run_pipeline(cfg, echo=quiet)
    assert [e["stage"] for e in result.stages] == list(cfg.stages)
    [metrics] = list(result.run_dir.rglob("metrics.jsonl"))
    records = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for rec in records:
        for key in cfg.reward.keys:
            assert rec[f"reward/{key}/errors"] == 0.0 and math.isfinite(rec[f"reward/{key}/mean"])
        trained = [k for k, w in zip(cfg.reward.keys, cfg.reward.resolved_weights) if w]
        assert rec["reward/mean"] == pytest.approx(sum(rec[f"reward/{k}/mean"] for k in trained), abs=1e-6)
    assert "exact_match" in result.eval["after_rl"]
