"""``rlft rm``: the reward-model stage end to end on the embedded task and on HH-RLHF rows, and its config keys."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlft.cli.main import main
from rlft.config import ConfigError
from rlft.recipe import load_config

HH = Path(__file__).resolve().parents[2] / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl"


def run_rm(tmp_path, tiny_model_dir, *extra: str) -> Path:
    args = ["rm", f"model.path={tiny_model_dir}", f"log.run_dir={tmp_path}", "log.name=rm", "model.device=cpu",
            "rm.steps=4", "rm.batch_size=4", "rm.num_eval=8", "data.synth_train_size=32", *extra]
    assert main(args) == 0
    return tmp_path / "rm"


def check_outputs(run: Path, steps: int) -> dict:
    from rlft.rewards import REWARDS

    config = json.loads((run / "reward_model" / "config.json").read_text())
    assert config["num_labels"] == 1 if "num_labels" in config else len(config["id2label"]) == 1
    records = [json.loads(x) for x in (run / "rm_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert all(math.isfinite(v) for r in records for v in r.values() if isinstance(v, float))
    ev = json.loads((run / "rm_eval.json").read_text())
    assert set(ev["after"]) >= {"rm/accuracy", "rm/margin", "rm/loss", "rm/reward_mean", "rm/reward_std"}
    reward = REWARDS.build("reward_model", {"path": str(run / "reward_model")})  # loads where rewards load
    assert all(math.isfinite(v) for v in reward(["#### 3", "no"], [{"prompt": "max(1,2,3)=?"}] * 2))
    return ev


def test_rm_on_the_embedded_task(tmp_path, tiny_model_dir, capsys):
    ev = check_outputs(run_rm(tmp_path, tiny_model_dir), steps=4)
    assert ev["pairs"] == 8
    assert "held-out ranking accuracy" in capsys.readouterr().out


def test_rm_on_hh_rlhf_rows(tmp_path, tiny_model_dir):
    """All 2312 rows parse into prompt/chosen/rejected; a tiny RM trains on them for a few steps with finite loss."""
    if not HH.is_file():
        pytest.skip(f"{HH} not found (../shared/data is only in the dev checkout)")
    run = run_rm(tmp_path, tiny_model_dir, f"rm.source={HH}", "rm.max_tokens=128", "rm.pooling=mean")
    ev = check_outputs(run, steps=4)
    assert math.isfinite(ev["after"]["rm/loss"])


def test_rm_needs_numeric_answers_when_it_makes_its_own_pairs(tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "words"
    data.mkdir()
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text(json.dumps({"q": "colour of the sky?", "a": "blue"}) + "\n")
    assert main(["rm", f"model.path={tiny_model_dir}", f"log.run_dir={tmp_path}", "log.name=w",
                 f"data.source={data}", "data.prompt_key=q", "data.answer_key=a", "data.template=raw"]) == 2
    assert "rm.source: empty" in capsys.readouterr().err


def alternate_verdicts(texts, examples, group_size, cfg):
    """A stand-in rule for an untrained model: every other sample is right."""
    import torch

    return torch.arange(len(texts)) % 2 == 0


def test_rm_on_policy_pairs_counts_both_kinds(tmp_path, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setattr("rlft.trainers.policy_pairs.rule_correct", alternate_verdicts)
    ev = check_outputs(run_rm(tmp_path, tiny_model_dir, "rm.pairs_from=both", "rm.policy_samples=4",
                              "rm.policy_prompts=6", "rollout.max_new_tokens=4", "data.num_eval=8"), steps=4)
    after = ev["after"]
    assert after["rm/task/pairs"] == 8 and after["rm/policy/pairs"] == 8  # one pair per held-out prompt, capped
    assert ev["pairs"] == 16  # rm/accuracy counts the held-out pairs of both kinds
    assert after["rm/policy_sample_accuracy"] == 0.5 and after["rm/policy_prompts_with_pairs"] == 6
    assert {"rm/task/accuracy", "rm/policy/accuracy"} <= set(ev["before"])
    assert "task + policy" in capsys.readouterr().out


def test_rm_on_policy_pairs_needs_both_outcomes(tmp_path, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setattr("rlft.trainers.policy_pairs.rule_correct",
                        lambda texts, *a: __import__("torch").zeros(len(texts), dtype=bool))
    assert main(["rm", f"model.path={tiny_model_dir}", f"log.run_dir={tmp_path}", "log.name=p", "model.device=cpu",
                 "rm.pairs_from=policy", "rm.policy_samples=2", "rm.policy_prompts=4", "data.synth_train_size=8",
                 "data.num_eval=4", "rollout.max_new_tokens=2"]) == 2
    assert "rm.pairs_from: the policy" in capsys.readouterr().err


@pytest.mark.parametrize("override, key", [("rm.steps=-1", "rm.steps"), ("rm.pooling=max", "rm.pooling"),
                                           ("rm.batch_size=0", "rm.batch_size"), ("rm.nope=1", "rm.nope"),
                                           ("rm.pairs_from=human", "rm.pairs_from"),
                                           ("rm.policy_samples=1", "rm.policy_samples"),
                                           ("rm.policy_prompts=-1", "rm.policy_prompts")])
def test_bad_rm_keys(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config(None, [override])


def test_on_policy_pairs_need_the_task():
    with pytest.raises(ConfigError, match="rm.pairs_from: 'policy' makes pairs from data.source"):
        load_config(None, ["rm.pairs_from=policy", "rm.source=prefs.jsonl"])
