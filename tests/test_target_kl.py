"""``algo.target_kl`` (an update stops before a mini-batch whose KL(pi_old || pi) exceeds 1.5 x the target,
Stable-Baselines3's rule) against a naive loop written from that rule, and ``algo.ref_refresh_every`` (the reference
takes the policy's weights every N RL steps); both refused where they cannot work."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rlft.config import ConfigError
from rlft.core.kl import make_kl_controller
from rlft.data.synthetic import synthetic_task
from rlft.data.templates import encode_prompts
from rlft.recipe import help_text, load_config
from rlft.trainers import update as upd
from rlft.trainers.rl import rl_step
from test_rl_loop import make_state, naive_logprobs, varied_batch, with_advantages
from test_rl_loop import make_cfg, model, tok  # noqa: F401  (the fixtures)

EPOCHS, MINIBATCHES = 3, 2


def _orders(n: int, seed: int) -> list[list[torch.Tensor]]:
    """The mini-batches of each epoch, in the update's order (its seeded permutation per epoch, state.step 0)."""
    gen = torch.Generator().manual_seed(seed * 100003)
    return [list(torch.randperm(n, generator=gen).chunk(MINIBATCHES)) for _ in range(EPOCHS)]


def _shifted_batch(model, tok, cfg):
    """A batch whose old log-probs are the policy's moved by a per-token delta: small on the first mini-batch's rows,
    large on the second's, so that the two mini-batches' KL(pi_old || pi) differ by a known order."""
    batch = with_advantages(varied_batch(tok))
    first = set(_orders(len(batch), cfg.train.seed)[0][0].tolist())
    g = torch.Generator().manual_seed(3)
    scale = torch.tensor([0.05 if i in first else 0.6 for i in range(len(batch))])[:, None]
    with torch.no_grad():
        logp = upd.batch_logprobs(model, batch, cfg)[0]
    batch.old_logp = (logp + scale * torch.randn(logp.shape, generator=g)) * batch.response_mask
    return batch


def _naive_kl(model, batch, rows) -> float:
    """Mean over the rows' valid tokens of k3 = (r - 1) - log r, r = pi / pi_old, one token at a time."""
    per_row = naive_logprobs(model, batch)
    total, count = 0.0, 0
    for i in rows.tolist():
        for t, lp in enumerate(per_row[i][0].tolist()):
            d = lp - batch.old_logp[i, t].item()
            total += math.exp(d) - 1 - d
            count += 1
    return total / count


def _naive_update(model, batch, cfg, target: float) -> tuple[int, bool, list[float]]:
    """Stable-Baselines3's loop with a policy that does not move (lr 0): (steps taken, stopped, KLs measured)."""
    done, measured = 0, []
    for epoch in _orders(len(batch), cfg.train.seed):
        for rows in epoch:
            measured.append(_naive_kl(model, batch, rows))
            if measured[-1] > 1.5 * target:
                return done, True, measured
            done += 1
    return done, False, measured


def _run(model, tok, cfg, batch):
    state = make_state(model, tok, lr=0.0)
    metrics = upd.update(state, batch, cfg)
    return state, metrics


@pytest.mark.parametrize("where", ["never", "between", "first", "factor"])
def test_target_kl_stops_where_the_naive_loop_stops(model, tok, make_cfg, where):
    base = make_cfg(f"algo.epochs={EPOCHS}", f"algo.minibatches={MINIBATCHES}")
    batch = _shifted_batch(model, tok, base)
    orders = _orders(len(batch), base.train.seed)
    k_first, k_second = (_naive_kl(model, batch, rows) for rows in orders[0])
    k_max = max(_naive_kl(model, batch, rows) for epoch in orders for rows in epoch)  # later epochs mix the rows
    assert k_second > 5 * k_first > 0  # the batch was built for this order
    target = {"never": 10 * k_max,
              "between": (k_first + k_second) / 2 / 1.5,  # the second mini-batch is over: one step, then stop
              "first": k_first / 2,  # over at once: no step at all
              "factor": k_max / 1.2}[where]  # above the target but never 1.5 times it: no stop (SB3's factor)
    cfg = make_cfg(f"algo.epochs={EPOCHS}", f"algo.minibatches={MINIBATCHES}", f"algo.target_kl={target!r}")
    want_done, want_stop, measured = _naive_update(model, batch, cfg, target)
    assert (want_done, want_stop) == {"never": (6, False), "between": (1, True), "first": (0, True),
                                      "factor": (6, False)}[where]
    state, m = _run(model, tok, cfg, batch)
    assert m["actor/minibatch_updates"] == want_done and m["actor/early_stopped"] == float(want_stop)
    assert len(state.optimizer.grads) == want_done  # optimizer steps taken
    assert all(p.grad is None for p in model.parameters())  # the stopped mini-batch's gradients were dropped
    assert state.scheduler.last_epoch == EPOCHS * MINIBATCHES  # the schedule moved past the skipped steps
    # float32 log-probs against the naive ones: the KLs (0.001 to 0.3) agree to a few 1e-6 relative
    assert m["actor/approx_kl"] == pytest.approx(sum(measured) / len(measured), rel=1e-4)
    assert ("actor/grad_norm" in m) == (want_done > 0)


def test_masked_old_logprobs_change_nothing(model, tok, make_cfg):
    cfg = make_cfg(f"algo.epochs={EPOCHS}", f"algo.minibatches={MINIBATCHES}", "algo.target_kl=0.01")
    batch = _shifted_batch(model, tok, cfg)
    _, m1 = _run(copy.deepcopy(model), tok, cfg, batch)
    batch.old_logp = torch.where(batch.response_mask.bool(), batch.old_logp, torch.full_like(batch.old_logp, 15.0))
    _, m2 = _run(copy.deepcopy(model), tok, cfg, batch)
    assert m1["actor/approx_kl"] == pytest.approx(m2["actor/approx_kl"], rel=1e-12)
    assert m1["actor/minibatch_updates"] == m2["actor/minibatch_updates"]


def test_without_target_kl_no_early_stop_metrics(model, tok, make_cfg):
    cfg = make_cfg(f"algo.epochs={EPOCHS}", f"algo.minibatches={MINIBATCHES}")
    state, m = _run(model, tok, cfg, _shifted_batch(model, tok, cfg))
    assert len(state.optimizer.grads) == EPOCHS * MINIBATCHES
    assert not {"actor/approx_kl", "actor/early_stopped", "actor/minibatch_updates"} & set(m)
    assert not upd.early_stop(1e9, 0.0) and upd.early_stop(0.151, 0.1) and not upd.early_stop(0.15, 0.1)


@pytest.mark.parametrize("extra, message", [
    (["algo.target_kl=-1"], "algo.target_kl: must be a finite number >= 0"),
    (["algo.target_kl=.nan"], "algo.target_kl: must be a finite number"),
    (["algo.target_kl=0.02", "algo.epochs=1", "algo.minibatches=1"], "algo.target_kl: stops the remaining"),
    (["algo.ref_refresh_every=-1"], "algo.ref_refresh_every: must be >= 0"),
    (["algo.ref_refresh_every=5", "algo.kl_coef=0"], "algo.ref_refresh_every: .*needs algo.kl_coef > 0"),
    (["algo.ref_refresh_every=5", "algo.kl_coef=0.1", "lora.rank=4"],
     "algo.ref_refresh_every: with LoRA .*the base model with the adapters switched off"),
])
def test_errors_name_the_key(extra, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, extra)


def test_the_two_kl_targets_are_different_keys():
    cfg = load_config(None, ["algo.kl_coef=0.1", "algo.kl_target=6", "algo.target_kl=0.02", "algo.epochs=2"])
    assert (cfg.algo.kl_target, cfg.algo.target_kl) == (6.0, 0.02)
    text = help_text()  # the field docstrings, `rlft config`, tell them apart
    assert "Not algo.target_kl" in text and "not the KL-to-reference target, algo.kl_target" in text


def test_sharded_launches_refuse_what_they_cannot_run():
    from rlft.parallel.strategy import refuse_unsharded_parts
    from rlft.parallel.zero import ZeroPlan, check_supported

    cfg = load_config(None, ["algo.kl_coef=0.1", "algo.ref_refresh_every=3"])
    with pytest.raises(ConfigError, match="algo.ref_refresh_every: not supported with an FSDP launch"):
        refuse_unsharded_parts(cfg, "an FSDP launch")
    with pytest.raises(ConfigError, match="algo.target_kl: not supported under DeepSpeed"):
        check_supported(load_config(None, ["algo.target_kl=0.02", "algo.epochs=2"]), ZeroPlan())


def test_refresh_ref_copies_the_policy(model, tok):
    state = make_state(model, tok)
    state.ref = copy.deepcopy(model).eval().requires_grad_(False)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    state.refresh_ref()
    assert all(torch.equal(r, p) for r, p in zip(state.ref.state_dict().values(), model.state_dict().values()))
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # a copy, not the same tensors: the reference stays
    assert not torch.equal(next(state.ref.parameters()), next(model.parameters()))
    assert not any(p.requires_grad for p in state.ref.parameters())
    state.ref = None
    with pytest.raises(RuntimeError, match="no reference model"):
        state.refresh_ref()


def test_rl_steps_refresh_the_reference_every_n(model, tok, make_cfg, digit_reward):
    cfg = make_cfg("reward.fns=[test_digit_share,format_final]", "reward.weights=[1.0,0.1]", "algo.group_size=4",
                   "train.prompts_per_step=2", "rollout.max_new_tokens=6", "algo.kl_coef=0.1",
                   "algo.ref_refresh_every=2")
    train_ex, _ = synthetic_task("max", n_train=10, n_eval=1, seed=0)
    state = make_state(model, tok, lr=0.1, examples=train_ex, prompts=encode_prompts(train_ex, "chat", tok, 512))
    state.ref = copy.deepcopy(model).eval().requires_grad_(False)
    state.kl_ctl = make_kl_controller(0.1, 0.0, 10000)
    start = {k: v.clone() for k, v in model.state_dict().items()}

    def ref_is(weights) -> bool:
        return all(torch.equal(state.ref.state_dict()[k], weights[k]) for k in weights)

    torch.manual_seed(0)
    flags = []
    for step in (1, 2, 3):
        flags.append(rl_step(state, cfg)["actor/ref_refreshed"])
        if step == 1:
            assert ref_is(start) and not ref_is(model.state_dict())  # the policy moved, the reference did not
        if step == 2:
            assert ref_is(model.state_dict())
            after_two = {k: v.clone() for k, v in model.state_dict().items()}
    assert flags == [0.0, 1.0, 0.0]
    assert ref_is(after_two) and not ref_is(model.state_dict())
    saved = state.trainer_state()["ref"]  # a checkpoint keeps the refreshed reference
    assert all(torch.equal(saved[k], after_two[k]) for k in after_two)


def test_rlft_train_logs_both(tmp_path, tiny_overrides, digit_reward):
    """A whole tiny run with both switches: every step logs the refresh flag and the early-stop counts."""
    import json

    from rlft.cli.main import main

    ov = tiny_overrides(tmp_path, "log.name=both", "sft.steps=0", "eval.before_rl=false", "algo.kl_coef=0.1",
                        "algo.ref_refresh_every=2", "algo.epochs=2", "algo.target_kl=1e-9", *digit_reward)
    assert main(["train", *ov]) == 0
    rows = [json.loads(line) for line in (tmp_path / "both" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/ref_refreshed" in r]
    assert [r["actor/ref_refreshed"] for r in steps] == [0.0, 1.0, 0.0]
    for r in steps:  # 2 planned steps; a stop after the first is the only one possible (its KL is 0 before it)
        assert r["actor/minibatch_updates"] in (1.0, 2.0)
        assert r["actor/early_stopped"] == float(r["actor/minibatch_updates"] == 1.0)
        assert r["actor/approx_kl"] >= 0
