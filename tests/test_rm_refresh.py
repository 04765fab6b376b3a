"""Online reward-model refresh (rm.refresh_every): the refresh retrains the very model the reward scores with, logs
its accuracy on the new pairs before and after, takes pairs only from groups with both outcomes, is saved with the
run and restored on resume; and the reward-hacking metrics are logged per RL step."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from rlft.rewards.terms import build
from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.data.synthetic import synthetic_task

RULE = "test_even_length"


def even_length(completion: str, sample) -> float:
    """A rule with both outcomes in most groups, even for an untrained policy."""
    return float(len(completion) % 2 == 0)


@pytest.fixture
def even_rule(monkeypatch):
    from rlft.rewards import REWARDS

    monkeypatch.setitem(REWARDS._items, RULE, even_length)
    return [f"eval.correct_fn={RULE}"]


@pytest.fixture(scope="module")
def rm_dir(tiny_model_dir, tmp_path_factory):
    from rlft.models.reward_head import build_reward_model

    model, tok = build_reward_model(str(tiny_model_dir), pooling="last")
    out = tmp_path_factory.mktemp("rm")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def refresh_config(tmp_path, rm_dir, *extra):
    return load_config(None, [f"log.run_dir={tmp_path}", "log.name=r", "model.device=cpu", "rm.refresh_every=1",
                              "rm.refresh_steps=10", "rm.refresh_lr=3e-3", "rm.batch_size=4",
                              f"reward.fns=[{{name: reward_model, path: '{rm_dir}'}}]", *extra])


def test_refresh_retrains_the_model_the_reward_scores_with(tmp_path, rm_dir):
    from rlft.trainers.rm_refresh import RMRefresh, own_reward_model

    cfg = own_reward_model(refresh_config(tmp_path, rm_dir), tmp_path / "run")
    reward = build(cfg.reward.fns[0])
    assert reward.path == str(tmp_path / "run" / "reward_model")  # the run's own copy, not the rm stage's
    refresher = RMRefresh(cfg)
    examples = synthetic_task("max", n_train=6, n_eval=1, max_operand=20, seed=1)[0]
    texts, correct = [], []
    for i, ex in enumerate(examples):  # groups of 3: two with both outcomes, then one all right, one all wrong...
        outcomes = [[True, False, False], [True, True, True], [False, False, False]][i % 3]
        texts += [f"#### {ex.ground_truth}" if c else f"#### {int(ex.ground_truth) + 1 + j}" for j, c in
                  enumerate(outcomes)]
        correct += outcomes
    refresher.record(examples, texts, torch.tensor(correct))
    assert len(refresher.groups) == 2  # only the groups whose outcomes differ
    samples = [{"prompt": ex.prompt} for ex in examples for _ in range(3)]
    before = reward(texts, samples)
    weights = copy.deepcopy(refresher.model.state_dict())
    m = refresher.refresh(cfg, seed=0)
    assert m["rm_refresh/pairs"] == 4.0  # 1 right x 2 wrong, in two groups
    assert m["rm_refresh/accuracy_after"] > m["rm_refresh/accuracy_before"] or m["rm_refresh/accuracy_after"] == 1.0
    assert m["rm_refresh/accuracy_after"] == 1.0 and m["rm_refresh/loss"] < 0.69
    assert any(not torch.equal(v, refresher.model.state_dict()[k]) for k, v in weights.items())
    assert reward(texts, samples) != before  # the reward scores with the refreshed weights at once
    assert refresher.groups == [] and refresher.refresh(cfg, seed=1) == {"rm_refresh/pairs": 0.0,
                                                                         "rm_refresh/count": 2.0}


def test_refresh_needs_one_reward_model():
    with pytest.raises(ConfigError, match="rm.refresh_every"):
        load_config(None, ["rm.refresh_every=2"])  # the default rewards are rule-based
    with pytest.raises(ConfigError, match="rm.refresh_steps"):
        load_config(None, ["rm.refresh_steps=0"])


def read_jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_rl_logs_refresh_and_hacking_metrics_saves_the_refreshed_rm_and_resumes_with_it(
        tmp_path, tiny_overrides, rm_dir, even_rule, monkeypatch):
    from rlft.runs import checkpoint
    from rlft.trainers import rl_loop as run_module
    from rlft.stages.pipeline import run_pipeline

    common = ["log.name=r", "train.save_every=2", "rm.refresh_every=1", "rm.refresh_steps=3", "rm.batch_size=4",
              "rm.refresh_lr=1e-2", "algo.group_size=4", "sft.steps=0", "eval.before_rl=false", "eval.ks=[]",
              f"reward.fns=[{{name: reward_model, path: '{rm_dir}'}}]", "reward.weights=[]", *even_rule]
    live = {}
    save = checkpoint.save
    monkeypatch.setattr(checkpoint, "save", lambda *a, trainer_state, **k: live.update(
        {a[1]: copy.deepcopy(trainer_state)}) or save(*a, trainer_state=trainer_state, **k))
    run_dir = run_pipeline(load_config(None, tiny_overrides(tmp_path, "train.steps=3", *common)), echo=lambda *a: None).run_dir
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert all({"rm_refresh/pairs", "reward_hacking/rule_accuracy", "reward_hacking/reward_up_rule_not"} <= set(r)
               for r in records)
    assert any("reward_hacking/pair_disagreement" in r for r in records)
    assert any(r["rm_refresh/pairs"] > 0 and "rm_refresh/accuracy_after" in r for r in records)
    saved = _weights(run_dir / "reward_model")
    assert any(not torch.equal(v, _weights(rm_dir)[k]) for k, v in saved.items())  # refreshed, and saved with the run
    assert live[2]["rm_refresh"]["refreshes"] == 2 and live[2]["hacking"]["compared"] == 1

    restored = {}
    real = run_module.restore
    monkeypatch.setattr(run_module, "restore", lambda state, *a: real(state, *a) or restored.update(
        rm=copy.deepcopy(state.rm_refresh.model.state_dict()), hacking=state.hacking.state_dict()))
    run_pipeline(load_config(None, tiny_overrides(tmp_path, "train.steps=4", "train.resume=true", *common)),
          echo=lambda *a: None)
    assert restored["hacking"] == live[2]["hacking"]
    assert all(torch.equal(v, live[2]["rm_refresh"]["model"][k]) for k, v in restored["rm"].items())
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3, 4]


def _weights(path) -> dict:
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(path).state_dict()
