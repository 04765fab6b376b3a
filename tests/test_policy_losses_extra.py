"""PPO-penalty (adaptive beta as trainer state) and Kimi k1.5 OMD end to end; the "+" KL estimators in the loss.

The formulas themselves are tested in tests/test_losses.py and tests/test_kl.py (the core coverage gate).
"""

from __future__ import annotations

import math

import pytest
import torch

from rlft.config import AlgoConfig, ConfigError
from rlft.recipe import load_config
from rlft.core.kl import PenaltyCoefController
from rlft.trainers import rl
from rlft.trainers.state import PromptSampler, RLState
from test_algorithms import run  # noqa: F401  (the fixture: a 3-step demo run on the tiny model)


PPO_PENALTY = ["algo.policy_loss=ppo_penalty", "algo.epochs=2", "algo.penalty_coef=1.0", "algo.penalty_target=0.01",
               "optim.lr=1e-2"]


# ---------------------------------------------------------------- config


@pytest.mark.parametrize("kwargs, match", [
    (dict(policy_loss="ppo_penalty"), "epochs \\* algo.minibatches > 1"),
    (dict(policy_loss="ppo_penalty", epochs=2, clip_c=3.0), "clip_c"),
    (dict(policy_loss="kimi_omd", clip_c=3.0), "clip_c"),
    (dict(penalty_coef=-1.0), "penalty_coef"),
    (dict(penalty_target=-0.1), "penalty_target"),
    (dict(penalty_coef=0.0, penalty_target=0.01), "penalty_target"),
    (dict(omd_tau=0.0), "omd_tau"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        AlgoConfig(**kwargs)


def test_config_accepts_the_pairings():
    AlgoConfig(policy_loss="ppo_penalty", minibatches=2, penalty_target=0.0)  # fixed beta
    AlgoConfig(policy_loss="kimi_omd", advantage="group_mean", loss_agg="seq-mean-token-sum", omd_tau=0.5)
    for est in ("k1+", "k2+", "k3+"):
        AlgoConfig(kl_coef=0.01, kl_estimator=est)


# ---------------------------------------------------------------- trainer state


def _bare_state() -> RLState:
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return RLState(policy=model, tokenizer=None, optimizer=opt, scheduler=sched,
                   sampler=PromptSampler(4, 0), examples=[], prompts=[])


def test_penalty_controller_built_only_for_ppo_penalty():
    cfg = load_config(None, PPO_PENALTY)
    state = _bare_state()
    ctl = rl.penalty_controller(state, cfg)
    assert isinstance(ctl, PenaltyCoefController) and ctl.state_dict() == {"value": 1.0, "target": 0.01}
    state.penalty_ctl = ctl
    assert rl.penalty_controller(state, cfg) is ctl  # built once, never replaced
    assert rl.penalty_controller(_bare_state(), load_config(None, [])) is None


def test_penalty_controller_in_trainer_state_round_trip():
    state = _bare_state()
    state.penalty_ctl = PenaltyCoefController(1.0, 0.01)
    state.penalty_ctl.update(0.0, 1)  # halved to 0.5
    saved = state.trainer_state()
    assert saved["penalty_ctl"] == {"value": 0.5, "target": 0.01}
    fresh = _bare_state()
    fresh.penalty_ctl = PenaltyCoefController(1.0, 0.01)  # as run.build_rl_state builds it, before the restore
    fresh.load_trainer_state(saved)
    assert fresh.penalty_ctl.state_dict() == saved["penalty_ctl"]
    other = _bare_state()
    other.load_trainer_state({**saved, "penalty_ctl": None})
    assert other.penalty_ctl is None
    assert _bare_state().trainer_state()["penalty_ctl"] is None


# ---------------------------------------------------------------- end to end


def test_ppo_penalty_trains_and_adapts_beta(run):
    _, records, cfg = run(*PPO_PENALTY)
    betas = [r["actor/ppo_penalty_coef"] for r in records]
    kls = [r["actor/ppo_penalty_kl_post"] for r in records]  # d, measured after each update
    assert betas[0] == cfg.algo.penalty_coef  # the config keeps the initial beta; the state moves
    assert cfg.algo.penalty_coef == 1.0
    for k in range(len(records) - 1):  # PPO §4: the rule applied to the step's measured KL gives the next beta
        d, beta = kls[k], betas[k]
        want = beta / 2 if d < 0.01 / 1.5 else (beta * 2 if d > 0.01 * 1.5 else beta)
        assert betas[k + 1] == pytest.approx(want)
    assert all(math.isfinite(k) and k >= 0 for k in kls)
    assert any(k > 0 for k in kls)  # the updates moved the policy away from pi_old
    assert all(r["actor/ppo_penalty_kl"] >= 0 for r in records)  # the in-update mean of the penalty term


def test_ppo_penalty_beta_survives_resume(run):
    run_dir, first, _ = run(*PPO_PENALTY, "train.steps=2", "train.save_every=1")
    saved = torch.load(run_dir / "checkpoints" / "step_000001" / "state.pt", weights_only=False)["trainer"]
    assert saved["penalty_ctl"]["target"] == 0.01
    assert saved["penalty_ctl"]["value"] == pytest.approx(first[1]["actor/ppo_penalty_coef"])  # beta after step 1
    _, second, _ = run(*PPO_PENALTY, "train.steps=3", "train.save_every=1", "train.resume=true")
    assert second[1]["actor/ppo_penalty_coef"] == pytest.approx(first[1]["actor/ppo_penalty_coef"])


def test_kimi_omd_trains(run):
    _, records, cfg = run("algo.policy_loss=kimi_omd", "algo.advantage=group_mean", "algo.loss_agg=seq-mean-token-sum",
                          "algo.omd_tau=0.5", "algo.epochs=2", "optim.lr=1e-2")
    assert cfg.algo.policy_loss == "kimi_omd"
    assert all(r["actor/pg_clipfrac"] == 0.0 for r in records)
    assert "actor/ppo_penalty_coef" not in records[0]


def test_k3_plus_in_the_loss_trains(run):
    _, records, _ = run("algo.kl_coef=0.1", "algo.kl_estimator=k3+")
    assert all(r["actor/kl_loss"] >= 0 for r in records)  # the value is k3's (>= 0)
