"""The learned process reward model: labelled solutions, the per-token head read at step ends, its BCE loss,
the prm stage and the ``process_reward_model`` reward with ``@prm`` in a pipeline."""

from __future__ import annotations

import json
import math
import random
from types import SimpleNamespace

import pytest
import torch

from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.data.synthetic import synthetic_task
from rlft.models.prm_head import encode_steps, line_steps
from rlft.models.tiny import build_tokenizer
from rlft.rewards import REWARDS
from rlft.trainers.prm import StepExample, perturbed, prm_loss, step_examples


def test_perturbed_moves_last_numbers_and_labels_follow_the_checker():
    rng = random.Random(0)
    ref = "12+7=19\n19-5=14\n14+3=17\n#### 17"
    for _ in range(20):
        out = perturbed(ref, rng)
        changed = [a != b for a, b in zip(out.split("\n"), ref.split("\n"))]
        assert 1 <= sum(changed) <= 2 and len(out.split("\n")) == 4
    train, _ = synthetic_task("chain", n_train=40, n_eval=1, max_operand=9)
    tok = build_tokenizer()
    data = step_examples(train, tok, REWARDS.get("chain_steps"), 0.5, 256, seed=0)
    assert all(len(x.labels) == len(x.positions) == 4 for x in data)
    assert 0 < sum(y for x in data for y in x.labels) < sum(len(x.labels) for x in data)  # right and wrong steps
    unperturbed = step_examples(train, tok, REWARDS.get("chain_steps"), 0.0, 256, seed=0)
    assert all(x.labels == [1.0] * 4 for x in unperturbed)  # the reference is right at every step


def test_encode_steps_points_at_each_steps_last_token():
    tok = build_tokenizer()
    prompt = ({"role": "user", "content": "1+2-1+1=? Answer after ####."},)
    completion = "1+2=3\n3-1=2\n2+1=3\n#### 3"
    ends = line_steps(completion)
    assert ends == [5, 11, 17, 24]
    ids, pos = encode_steps(tok, prompt, completion, ends, max_tokens=256)
    text = tok.decode(ids)
    assert text.endswith(completion) and text.startswith("Q: 1+2-1+1=?")
    assert [tok.decode([ids[p]]) for p in pos] == ["3", "2", "3", "3"]
    n_prompt = len(ids) - len(completion)
    assert [p - n_prompt for p in pos] == [e - 1 for e in ends]
    short, pos2 = encode_steps(tok, prompt, completion, ends, max_tokens=30)  # the prompt's start is cut
    assert len(short) == 30 and short[-len(completion):] == ids[-len(completion):]
    assert [p - (30 - len(completion)) for p in pos2] == [e - 1 for e in ends]


class FixedLogits(torch.nn.Module):
    """A stand-in model whose per-token logit is the token id / 10 - 1."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(logits=(input_ids.float() / 10 - 1 + self.w)[..., None])


def test_prm_loss_hand():
    # logits at the steps: ids 20 -> 1.0, 5 -> -0.5, 10 -> 0.0; labels 1, 0, 1
    batch = [StepExample([20, 3, 5], [0, 2], [1.0, 0.0]), StepExample([10], [0], [1.0])]
    loss, m = prm_loss(FixedLogits(), batch, pad_id=0)
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731
    want = (softplus(-1.0) + softplus(-0.5) + softplus(-0.0)) / 3  # BCE: -log sigma(z) for 1, -log(1 - sigma(z)) for 0
    assert loss.item() == pytest.approx(want)
    assert m["prm/accuracy"].item() == pytest.approx(2 / 3)  # 1.0 > 0 right, -0.5 < 0 right, 0.0 is not > 0: wrong
    assert m["prm/positive_rate"].item() == pytest.approx(2 / 3)


def test_config_checks():
    with pytest.raises(ConfigError, match="prm.labels"):
        load_config(None, ["prm.labels=final_answer"])
    with pytest.raises(ConfigError, match="reward.fns: .*needs a prm stage"):
        load_config(None, ["stages=[sft,rl]", "algo.advantage=process", "reward.weights=[1.0]",
                           "reward.fns=[{name: process_reward_model, path: '@prm'}]"])
    with pytest.raises(ConfigError, match="path: .* is not a directory"):
        load_config(None, ["reward.fns=[{name: process_reward_model, path: /nonexistent}]", "reward.weights=[1.0]"])


def test_sft_prm_rl_pipeline_scores_with_the_trained_prm(tmp_path, tiny_size_overrides, monkeypatch):
    from conftest import spy_rl_start
    from rlft.stages.pipeline import run_pipeline

    started = spy_rl_start(monkeypatch)
    cfg = load_config(None, tiny_size_overrides(
        tmp_path, "log.name=p", "stages=[sft,prm,rl]", "data.source=synthetic:chain", "data.synth_max_operand=9",
        "data.synth_train_size=24", "train.steps=2", "prm.steps=3", "prm.batch_size=4", "eval.ks=[1]",
        "rollout.max_new_tokens=12", "algo.advantage=process", "reward.weights=[1.0]",
        "reward.fns=[{name: process_reward_model, path: '@prm'}]"))
    entries = run_pipeline(cfg, echo=lambda *a: None).stages
    run = tmp_path / "p"
    assert [e["stage"] for e in entries] == ["sft", "prm", "rl"]
    assert {"prm/loss", "prm/accuracy"} <= set(entries[1]["metrics"]) and "exact_match" in entries[2]["metrics"]
    assert started["reward_paths"] == [str(run / "1-prm" / "prm_model")]
    assert started["model_path"] == str(run / "0-sft" / "policy")  # RL continues from the policy, not the PRM
    records = [json.loads(x) for x in (run / "2-rl" / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        assert r["reward/process_reward_model/errors"] == 0 and 0 < r["process/step_reward/mean"] < 1
    steps = REWARDS.build("process_reward_model", {"path": str(run / "1-prm" / "prm_model")})(
        "1+2=3\n\n#### 3", {"prompt": "1+2=?", "ground_truth": "3"})
    assert [e for e, _ in steps] == [5, 13] and all(0 < p < 1 for _, p in steps)
