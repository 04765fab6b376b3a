"""The façade trainers' log_history, summary and TrainOutput from a run's metric rows (the one windowing the SFT,
DPO, reward and GRPO trainers share), on rows given by a stand-in for the rlft.api stage: no model, no run."""

from types import SimpleNamespace

import pytest

from rlft import api
from rlft.trl import (DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, RewardConfig, RewardTrainer, SFTConfig,
                      SFTTrainer)


def _trainer(cls, args, rows, overrides=None):
    t = object.__new__(cls)  # the constructor's model and rows are not what is tested here
    t.args, t.rows, t.eval_rows, t.overrides, t.callables = args, [{}] * rows, None, dict(overrides or {}), []
    return t


def _stage(monkeypatch, stage, metrics, seconds=2.0):
    got = {}

    def run(recipe, overrides, train_data, eval_data, rewards=None):
        got.update(overrides=dict(overrides), eval_data=eval_data)
        return SimpleNamespace(metrics=metrics, seconds=seconds)

    monkeypatch.setattr(api, stage, run)
    return got


@pytest.mark.parametrize("cls, config, stage, names", [
    (SFTTrainer, SFTConfig, "sft", {"loss": "sft/loss", "mean_token_accuracy": "sft/mean_token_accuracy",
                                    "grad_norm": "sft/grad_norm"}),
    (DPOTrainer, DPOConfig, "dpo", {"loss": "dpo/loss", "rewards/margins": "dpo/rewards/margins"}),
    (RewardTrainer, RewardConfig, "rm", {"loss": "rm/loss", "accuracy": "rm/accuracy_train"}),
])
def test_stage_windows_by_logging_steps(monkeypatch, cls, config, stage, names):
    rows = [{ours: float(i + j) for j, ours in enumerate(names.values())} | {f"{stage}/lr": 0.1 * (i + 1)}
            for i in range(5)]
    for r in rows:  # every metric of TRL's table present (what the stage writes), the checked ones varying
        r.update({f"{stage}/{k}": 0.0 for k in ("grad_norm", "rewards/chosen", "rewards/rejected",
                                               "rewards/accuracies", "rewards/margins", "mean_token_accuracy",
                                               "accuracy_train", "margin_train", "reward_mean_train")
                  if f"{stage}/{k}" not in r})
    got = _stage(monkeypatch, stage, rows)
    args = config(output_dir="out", logging_steps=2, per_device_train_batch_size=2, gradient_accumulation_steps=1,
                  bf16=False)
    trainer = _trainer(cls, args, rows=4)
    out = trainer.train(resume_from_checkpoint=True)

    history = trainer.state.log_history
    assert [(e["step"], e["epoch"]) for e in history[:-1]] == [(2, 1.0), (4, 2.0), (5, 2.5)]  # 2 rows/step of 4
    assert [e["loss"] for e in history[:-1]] == [0.5, 2.5, 4.0]  # the mean over each window of 2 steps
    assert [e["learning_rate"] for e in history[:-1]] == pytest.approx([0.2, 0.4, 0.5])  # the last, not a mean
    assert history[-1] == {"train_runtime": 2.0, "train_loss": 2.0, "epoch": 2.5, "step": 5}
    assert out == (5, 2.0, {"train_runtime": 2.0, "train_loss": 2.0, "epoch": 2.5})
    assert (trainer.state.global_step, trainer.state.max_steps, trainer.state.epoch) == (5, 5, 2.5)
    assert got["overrides"]["train.resume"] is True and got["eval_data"] == trainer.rows


def test_grpo_windows_by_optimizer_steps(monkeypatch):
    rows = [{"loss": float(i), "reward": 10.0 * i, "actor/x": 1.0, "learning_rate": 0.1 * i, "num_tokens": 7.0 * i}
            for i in range(1, 4)]
    rows[0].pop("loss")  # a step without the metric: its window's mean counts it as 0, train_loss leaves it out
    _stage(monkeypatch, "train", rows)
    args = GRPOConfig(output_dir="out", logging_steps=4, num_iterations=2, bf16=False)
    trainer = _trainer(GRPOTrainer, args, rows=8, overrides={"train.prompts_per_step": 4})
    out = trainer.train()

    history = trainer.state.log_history
    assert history[:-1] == [
        {"loss": 1.0, "reward": 15.0, "learning_rate": pytest.approx(0.2), "num_tokens": 14.0, "epoch": 1.0,
         "step": 4},
        {"loss": 3.0, "reward": 30.0, "learning_rate": pytest.approx(0.3), "num_tokens": 21.0, "epoch": 1.5,
         "step": 6}]
    assert list(history[-1]) == ["train_runtime", "train_steps_per_second", "train_loss", "epoch", "step"]
    assert (history[-1]["train_loss"], history[-1]["epoch"], history[-1]["step"]) == (2.5, 1.5, 6)
    assert (out.global_step, out.training_loss, trainer.state.global_step) == (6, 2.5, 6)
