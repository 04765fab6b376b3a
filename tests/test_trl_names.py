"""TRL's metric names beside rlft's (rlft.trainers.trl_names): each the quantity TRL's GRPOTrainer logs, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.recipe import load_config
from rlft.core.kl import make_kl_controller
from rlft.models.forward import response_logprobs
from rlft.models.loading import load_model, load_tokenizer
from rlft.trainers import rl, trl_names
from rlft.trainers.update import update as update_policy

NAN = math.nan


def test_reward_is_the_nansum_total_and_reward_std_the_mean_group_std():
    # two functions, weights 1 and 2; G = 2; sample 1's second function is unscorable (None)
    parts = torch.tensor([[1.0, 0.5], [0.0, NAN], [1.0, 1.0], [0.0, 0.0]])
    m = trl_names.reward_metrics(parts, [1.0, 2.0], ["acc", "fmt"], 2)
    # totals, TRL's nansum: 2, 0, 3, 0 -> mean 1.25
    assert m["reward"] == pytest.approx(1.25)
    # per group unbiased std: [2, 0] -> sqrt(2); [3, 0] -> 3 / sqrt(2); their mean, not the batch std (1.5)
    assert m["reward_std"] == pytest.approx((math.sqrt(2) + 3 / math.sqrt(2)) / 2)
    assert m["reward_std"] != pytest.approx(torch.tensor([2.0, 0.0, 3.0, 0.0]).std().item())
    assert m["rewards/acc/mean"] == pytest.approx(0.5)
    assert m["rewards/acc/std"] == pytest.approx(math.sqrt(1 / 3))  # [1, 0, 1, 0]: variance 1/3 unbiased
    assert m["rewards/fmt/mean"] == pytest.approx(0.5)  # [0.5, 1, 0]: None left out
    assert m["rewards/fmt/std"] == pytest.approx(0.5)


def test_a_function_that_scored_nothing_logs_zeros():
    m = trl_names.reward_metrics(torch.tensor([[NAN], [NAN]]), [1.0], ["judge"], 2)
    assert (m["reward"], m["reward_std"], m["rewards/judge/mean"], m["rewards/judge/std"]) == (0.0, 0.0, 0.0, 0.0)


def test_completion_lengths_and_the_clipped_ratio():
    m = trl_names.completion_metrics(torch.tensor([3, 16, 7, 16]), torch.tensor([False, True, False, True]))
    assert m == {"completions/mean_length": 10.5, "completions/min_length": 3.0, "completions/max_length": 16.0,
                 "completions/mean_terminated_length": 5.0, "completions/min_terminated_length": 3.0,
                 "completions/max_terminated_length": 7.0, "completions/clipped_ratio": 0.5}
    none_ended = trl_names.completion_metrics(torch.tensor([4, 4]), torch.tensor([True, True]))
    assert none_ended["completions/mean_terminated_length"] == 0.0 and none_ended["completions/clipped_ratio"] == 1.0


def test_update_names_and_the_clip_region():
    m = trl_names.update_metrics({"actor/entropy": 1.5, "actor/pg_clipfrac_low": 0.1, "actor/pg_clipfrac_high": 0.25,
                                  "actor/grad_norm": 3.0, "actor/ref_kl": 0.02}, next_lr=1e-5)
    assert m == {"entropy": 1.5, "clip_ratio/low_mean": 0.1, "clip_ratio/high_mean": 0.25, "grad_norm": 3.0,
                 "kl": 0.02, "clip_ratio/region_mean": pytest.approx(0.35), "learning_rate": 1e-5}
    assert "kl" not in trl_names.update_metrics({"actor/entropy": 1.0})  # no KL term: no kl, as TRL with beta 0


def test_reward_metrics_of_a_step_carry_trls_names(tiny_overrides, tmp_path):
    from types import SimpleNamespace

    cfg = load_config(None, tiny_overrides(tmp_path, "algo.group_size=2", "reward.fns=[final_answer, format_final]",
                                           "reward.weights=[1.0, 0.5]"))
    batch = SimpleNamespace(scores=torch.tensor([1.5, 0.0, NAN, 0.5]), response_lengths=torch.tensor([4, 16, 2, 9]),
                            truncated=torch.tensor([False, True, False, False]))
    scored = SimpleNamespace(per_fn={"final_answer": [1.0, 0.0, None, 0.0], "format_final": [1.0, 0.0, 1.0, 1.0]},
                             errors={})
    m = rl.reward_metrics([(batch, scored)], cfg)
    assert m["reward"] == pytest.approx((1.5 + 0 + 0.5 + 0.5) / 4)  # TRL counts sample 2's None as nothing
    assert m["reward/mean"] == pytest.approx((1.5 + 0 + 0.5) / 3)  # rlft's: the scorable totals
    assert m["rewards/final_answer/mean"] == pytest.approx(m["reward/final_answer/mean"]) == pytest.approx(1 / 3)
    assert m["completions/clipped_ratio"] == m["response_length/clip_ratio"] == 0.25
    assert m["completions/min_length"] == 2.0 and m["completions/mean_terminated_length"] == 5.0


def test_kl_is_the_token_mean_of_k3_whatever_the_aggregation_and_estimator(tiny_model_dir, tiny_overrides, tmp_path):
    """TRL's ``kl``: sum(k3 * mask) / sum(mask) with k3 = exp(ref - logp) - (ref - logp) - 1; rlft's actor/kl_loss
    here is k1 aggregated seq-mean-token-mean, another number."""
    from test_rl_loop import make_state, varied_batch, with_advantages

    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    cfg = load_config(None, tiny_overrides(tmp_path, "rollout.max_new_tokens=8", "algo.group_size=2",
                                           "algo.kl_coef=0.1", "algo.kl_estimator=k1",
                                           "algo.loss_agg=seq-mean-token-mean"))
    batch = with_advantages(varied_batch(tok))
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                    batch.response_mask, temperature=cfg.rollout.temperature)
    g = torch.Generator().manual_seed(3)
    batch.ref_logp = (logp - 0.5 * torch.rand(logp.shape, generator=g)) * batch.response_mask
    state = make_state(model, tok, lr=0.0)
    state.kl_ctl = make_kl_controller(0.1, 0.0, 1)
    metrics = update_policy(state, batch, cfg)
    d = (batch.ref_logp - logp) * batch.response_mask
    k3 = (torch.exp(d) - d - 1) * batch.response_mask
    expected = (k3.sum() / batch.response_mask.sum()).item()
    assert metrics["actor/ref_kl"] == pytest.approx(expected, rel=1e-4)
    assert trl_names.update_metrics(metrics)["kl"] == metrics["actor/ref_kl"]
    assert abs(metrics["actor/kl_loss"] - expected) > 1e-3
    # TRL's loss: the whole loss minimised, here the policy-gradient term plus beta times the KL term
    assert metrics["actor/loss"] == pytest.approx(metrics["actor/pg_loss"] + 0.1 * metrics["actor/kl_loss"], abs=1e-6)
    assert trl_names.update_metrics(metrics)["loss"] == metrics["actor/loss"]
