"""Rollout correction (issue 34, rlft.core.rollout_corr): hand-computed weights of every mode against the
definitions of verl (``rollout_corr_helper.compute_rollout_correction_weights``: rho = exp(old - rollout) per token or
exp(sum) per sequence, clamp(max=C) for TIS, zero outside [lower, upper] for IcePop) and TRL (``token_truncate``,
``sequence_truncate``, ``token_mask``, ``sequence_mask``), a naive loop, masked positions, a sampler perturbed by a
known amount (the corrected policy gradient, computed exactly by enumeration in float64, equals the on-policy one,
or stays within the bias the truncation or the mask admits), the metrics of a planted gap, config errors, and a short
run with rollout.sampler=generate."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from rlft.config import AlgoConfig, ConfigError
from rlft.core.losses import POLICY_LOSSES
from rlft.core.rollout_corr import correction_weights, gap_metrics, gap_stats, resolve
from rlft.models.loading import load_model, load_tokenizer
from rlft.recipe import load_config
from rlft.rollout.hf import generate, samples_exactly
from rlft.trainers import update as upd
from numerics import FORWARD_DEPTH, assert_rounding_close, model_reduction_len

MODES = ("off", "token_tis", "seq_tis", "token_mis", "seq_mis")
E = math.e

# two rows, the last column padding: row 0 log rho_t = (0.5, -1, 1), sum 0.5; row 1 log rho_t = (0.5, 0.5, 0), sum 1
OLD = torch.tensor([[-1.0, -2.0, -0.2, 0.0], [-3.0, -3.0, -0.1, 5.0]], dtype=torch.float64)
ROLLOUT = torch.tensor([[-1.5, -1.0, -1.2, 9.0], [-3.5, -3.5, -0.1, -7.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])


def weights(mode, old=OLD, rollout=ROLLOUT, mask=MASK, cap=2.0, low=0.5):
    return correction_weights(old, rollout, mask, mode, cap, low)


@pytest.mark.parametrize("mode, want, rejected", [
    ("off", [[1, 1, 1, 0], [1, 1, 1, 0]], []),
    # verl rollout_is=token / TRL token_truncate: min(rho_t, C)
    ("token_tis", [[E ** .5, E ** -1, 2.0, 0], [E ** .5, E ** .5, 1.0, 0]], []),
    # verl rollout_is=sequence / TRL sequence_truncate: min(prod_t rho_t, C) on every token of the row
    ("seq_tis", [[E ** .5] * 3 + [0], [2.0] * 3 + [0]], []),
    # IcePop (verl "0.5_2.0"): rho_t kept inside [0.5, 2], else 0; e^-1 < 0.5 and e > 2 are dropped
    ("token_mis", [[E ** .5, 0, 0, 0], [E ** .5, E ** .5, 1.0, 0]], [(0, 1), (0, 2)]),
    # TRL sequence_mask, two-sided: row 1's e > 2 drops the whole row
    ("seq_mis", [[E ** .5] * 3 + [0], [0, 0, 0, 0]], [(1, 0), (1, 1), (1, 2)]),
])
def test_each_mode_by_hand(mode, want, rejected):
    w, rej = weights(mode)
    assert torch.allclose(w, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-15)
    assert sorted(map(tuple, rej.nonzero().tolist())) == rejected


def naive(old, rollout, mask, mode, cap, low):
    """The definitions, one token at a time with math.exp."""
    B, T = old.shape
    out = [[0.0] * T for _ in range(B)]
    for i in range(B):
        toks = [t for t in range(T) if mask[i, t]]
        seq = math.exp(sum(float(old[i, t] - rollout[i, t]) for t in toks))
        for t in toks:
            rho = seq if mode.startswith("seq") else math.exp(float(old[i, t] - rollout[i, t]))
            if mode == "off":
                out[i][t] = 1.0
            elif mode.endswith("tis"):
                out[i][t] = min(rho, cap)
            else:
                out[i][t] = rho if low <= rho <= cap else 0.0
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("mode", MODES)
def test_equals_a_naive_loop(mode):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 7, generator=g, dtype=torch.float64) * 3
    rollout = old + 0.3 * torch.randn(6, 7, generator=g, dtype=torch.float64)
    mask = (torch.rand(6, 7, generator=g) < 0.8).long()
    w, _ = correction_weights(old, rollout, mask, mode, 1.5, 0.7)
    # float64 exp of a sum of 7 terms: a few ulps of relative error
    assert torch.allclose(w, naive(old, rollout, mask, mode, 1.5, 0.7), rtol=1e-13, atol=0)


@pytest.mark.parametrize("mode", MODES)
def test_masked_positions_change_nothing(mode):
    w, rej = weights(mode)
    m = gap_metrics([gap_stats(OLD, ROLLOUT, MASK, mode, rej)])
    junk_old, junk_rollout = OLD.clone(), ROLLOUT.clone()
    junk_old[:, 3], junk_rollout[:, 3] = 1e6, -math.inf
    w2, rej2 = weights(mode, junk_old, junk_rollout)
    assert torch.equal(w, w2) and torch.equal(rej, rej2)
    assert gap_metrics([gap_stats(junk_old, junk_rollout, MASK, mode, rej2)]) == m


def test_a_token_without_the_sampler_s_log_prob_counts_as_ratio_one():
    rollout = ROLLOUT.clone()
    rollout[0, 0] = math.nan  # vLLM returned no log-prob for it
    w, _ = weights("token_tis", rollout=rollout)
    assert w[0, 0] == 1.0 and torch.isfinite(w).all()
    assert gap_metrics([gap_stats(OLD, rollout, MASK, "token_tis", torch.zeros_like(MASK).bool())])[
        "rollout_corr/logp_gap_max"] == 1.0  # |0.5| gone, |-1| and |1| left


def test_auto_is_off_only_where_the_sampler_is_exact():
    assert resolve("auto", True) == "off" and resolve("auto", False) == "token_tis"
    assert resolve("seq_mis", True) == "seq_mis"
    exact = load_config(None, [])
    assert samples_exactly(exact)
    for override in ("rollout.sampler=vllm", "model.autocast=bfloat16", "model.dtype=bfloat16"):
        assert not samples_exactly(load_config(None, [override])), override
    assert upd.rollout_correction(load_config(None, ["rollout.sampler=vllm"])) == "token_tis"


# --------------------------------------------------------------------------- a sampler perturbed by a known amount

V = 3  # sequences of two tokens over three: all nine enumerated


def policy_logprobs(theta1, theta2, ys):
    """(N, 2) log pi(y_1), log pi(y_2 | y_1) of the tabular policy."""
    lp1 = torch.log_softmax(theta1, -1)[ys[:, 0]]
    lp2 = torch.log_softmax(theta2, -1)[ys[:, 0], ys[:, 1]]
    return torch.stack([lp1, lp2], 1)


def expected_gradient(mode, cap, low, *, sampler_shift, length=2):
    """(corrected gradient, on-policy gradient, per-sequence quantities) of the sequence-summed clip loss with
    single-pass old log-probs, each an exact expectation: sum_y mu(y) grad L(y) and sum_y pi(y) grad L_on(y)."""
    g = torch.Generator().manual_seed(3)
    theta1 = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True)
    theta2 = torch.randn(V, V, generator=g, dtype=torch.float64, requires_grad=True)
    ys = torch.tensor(list(itertools.product(range(V), repeat=2)))  # (9, 2)
    adv = torch.linspace(-1.0, 1.5, len(ys), dtype=torch.float64)[:, None].expand(-1, 2)  # sequence-constant A
    mask = torch.ones(len(ys), 2)
    if length == 1:
        mask[:, 1] = 0
    logp = policy_logprobs(theta1, theta2, ys)  # (9, 2)
    with torch.no_grad():  # the sampler: the policy's logits moved by a fixed amount
        mu_logp = policy_logprobs(theta1 + sampler_shift * torch.tensor([1.0, -0.5, 0.0], dtype=torch.float64),
                                  theta2 + sampler_shift * torch.eye(V, dtype=torch.float64), ys)
        mu = (mu_logp * mask).sum(1).exp()  # (9,) mu(y)
        pi = (logp * mask).sum(1).exp()
        if length == 1:  # the nine rows hold each first token three times: weigh each once
            mu, pi = mu / V, pi / V
    loss_mat, _ = POLICY_LOSSES.get("clip")(logp, logp.detach(), adv, mask, AlgoConfig())
    w, rejected = correction_weights(logp.detach(), mu_logp, mask, mode, cap, low)
    corrected = (mu * (loss_mat * w).sum(1)).sum()
    on_policy = (pi * loss_mat.sum(1)).sum()
    params = (theta1, theta2)
    g_corr = torch.cat([x.flatten() for x in torch.autograd.grad(corrected, params, retain_graph=True)])
    g_on = torch.cat([x.flatten() for x in torch.autograd.grad(on_policy, params, retain_graph=True)])
    per_seq = []  # (mu, pi, rho, |A|, ||grad log pi(y)||, rejected) of every sequence
    for i in range(len(ys)):
        grad_i = torch.autograd.grad((logp[i] * mask[i]).sum(), params, retain_graph=True)
        norm = float(torch.cat([x.flatten() for x in grad_i]).norm())
        rho = float(((logp[i].detach() - mu_logp[i]) * mask[i]).sum().exp())
        per_seq.append((float(mu[i]), float(pi[i]), rho, abs(float(adv[i, 0])), norm, bool(rejected[i].any())))
    return g_corr, g_on, per_seq


TIGHT = 1e-12  # float64 sums of a few dozen terms of size <= 10


def test_the_sequence_ratio_makes_the_sampler_s_gradient_the_on_policy_one():
    g_corr, g_on, per_seq = expected_gradient("seq_tis", 1e6, 0.0, sampler_shift=0.4)
    assert (g_corr - g_on).abs().max() < TIGHT  # E_mu[rho g] = E_pi[g]: unbiased while no weight is capped
    g_off, g_on, _ = expected_gradient("off", 2.0, 0.5, sampler_shift=0.4)
    assert (g_off - g_on).norm() > 1e-2  # the planted gap biases the uncorrected gradient


def test_the_token_ratio_is_exact_for_one_token():
    g_corr, g_on, _ = expected_gradient("token_tis", 1e6, 0.0, sampler_shift=0.4, length=1)
    assert (g_corr - g_on).abs().max() < TIGHT


def test_truncation_stays_within_its_bias_bound():
    cap = 1.2
    g_corr, g_on, per_seq = expected_gradient("seq_tis", cap, 0.0, sampler_shift=0.4)
    # g_on - g_corr = E_mu[(rho - min(rho, C)) g]: |.| <= sum_y mu(y) (rho(y) - C)_+ |A(y)| ||grad log pi(y)||
    bound = sum(mu * max(rho - cap, 0.0) * a * n for mu, _, rho, a, n, _ in per_seq)
    assert 0 < bound and float((g_corr - g_on).norm()) <= bound + TIGHT
    assert any(rho > cap for _, _, rho, *_ in per_seq)  # the cap is active


def test_masking_stays_within_the_gradient_of_what_it_dropped():
    g_corr, g_on, per_seq = expected_gradient("seq_mis", 1.25, 0.8, sampler_shift=0.4)
    # kept sequences carry mu rho = pi exactly; the bias is the on-policy gradient of the dropped ones
    bound = sum(pi * a * n for _, pi, _, a, n, dropped in per_seq if dropped)
    assert any(d for *_, d in per_seq) and not all(d for *_, d in per_seq)
    assert float((g_corr - g_on).norm()) <= bound + TIGHT


# --------------------------------------------------------------------------- metrics of a planted gap


def test_the_metrics_report_the_planted_gap():
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 2
    delta = torch.tensor([0.1, -0.2, 0.05, 0.3, -0.4], dtype=torch.float64).expand(4, 5)  # planted: mu = pi_old e^delta
    mask = torch.ones(4, 5, dtype=torch.long)
    mask[3, 2:] = 0
    valid = mask.bool()
    parts = []
    for rows in (slice(0, 2), slice(2, 4)):  # two micro-batches, combined as the update does
        w, rej = correction_weights(old[rows], old[rows] + delta[rows], mask[rows], "token_mis", 1.2, 0.8)
        parts.append(gap_stats(old[rows], old[rows] + delta[rows], mask[rows], "token_mis", rej))
    m = gap_metrics(parts)
    assert m["rollout_corr/logp_gap_mean"] == pytest.approx(float(delta.abs()[valid].mean()), abs=1e-12)
    assert m["rollout_corr/logp_gap_max"] == pytest.approx(0.4, abs=1e-12)
    assert m["rollout_corr/kl"] == pytest.approx(float(delta[valid].mean()), abs=1e-12)  # E[log mu - log pi_old]
    assert m["rollout_corr/ratio_max"] == pytest.approx(math.exp(0.4), rel=1e-6)  # rho = e^-delta; float32 exp
    # rho outside [0.8, 1.2]: e^0.2 = 1.221 (delta -0.2), e^0.4 (delta -0.4), e^-0.3 = 0.741 (delta 0.3): columns
    # 1, 3 and 4 of the three full rows, column 1 of the last (2 valid tokens); 17 valid tokens
    assert m["rollout_corr/masked_frac"] == pytest.approx((3 * 3 + 1) / 17, abs=1e-12)


# row 0: log rho_t = (0.3, 0.3, 0.3), sum 0.9; row 1: (0.6, -0.6, 0), sum 0. The largest token ratio is e^0.6 (row 1),
# the largest sequence ratio e^0.9 (row 0): the two levels disagree on which row and which value
SEQ_OLD = torch.tensor([[-1.0, -1.0, -1.0, 0.0], [-2.0, -2.6, -0.5, 3.0]], dtype=torch.float64)
SEQ_ROLLOUT = torch.tensor([[-1.3, -1.3, -1.3, -4.0], [-2.6, -2.0, -0.5, 1.0]], dtype=torch.float64)


@pytest.mark.parametrize("mode, ratio_max, masked_frac", [
    ("token_tis", math.exp(0.6), 0.0),
    ("token_mis", math.exp(0.6), 0.0),  # e^0.3, e^0.6, e^-0.6 = 0.549 and 1 are all inside [0.5, 2]
    ("seq_tis", math.exp(0.9), 0.0),
    ("seq_mis", math.exp(0.9), 3 / 6),  # row 0's sequence ratio e^0.9 = 2.46 > 2 drops its three tokens
    ("off", math.exp(0.6), 0.0),
])
def test_the_sequence_modes_report_the_sequence_ratio(mode, ratio_max, masked_frac):
    """rollout_corr/ratio_max is the ratio the mode weighs by: prod_t rho_t for seq_tis and seq_mis, never the
    largest per-token rho_t; the metrics the trainer logs (``update.corrected``) say the same."""
    from types import SimpleNamespace

    micro = SimpleNamespace(rollout_logp=SEQ_ROLLOUT)
    pg = torch.ones_like(SEQ_OLD)
    _, parts = upd.corrected(pg, SEQ_OLD, micro, MASK, mode, AlgoConfig(rollout_corr_cap=2.0, rollout_corr_low=0.5))
    m = gap_metrics([parts])
    assert m["rollout_corr/ratio_max"] == pytest.approx(ratio_max, rel=1e-6)  # float32 exp
    assert m["rollout_corr/masked_frac"] == pytest.approx(masked_frac, abs=1e-15)
    # the gap metrics stay per token whatever the level: |0.3| x 3, |0.6| x 2, 0 over six tokens
    assert m["rollout_corr/logp_gap_mean"] == pytest.approx((0.9 + 1.2) / 6, abs=1e-12)
    assert m["rollout_corr/logp_gap_max"] == pytest.approx(0.6, abs=1e-12)
    assert m["rollout_corr/kl"] == pytest.approx(-0.9 / 6, abs=1e-12)  # mean of log mu - log pi_old


def test_the_update_keeps_the_largest_maximum_over_its_optimizer_steps(monkeypatch):
    """A mini-batch's ``_max`` metrics are maxima; over the update's optimizer steps they stay maxima (the largest),
    while every other metric is averaged."""
    from types import SimpleNamespace

    import rlft.trainers.update as up

    steps = iter([{"rollout_corr/logp_gap_max": 0.1, "rollout_corr/ratio_max": 3.0, "actor/pg_loss": 1.0},
                  {"rollout_corr/logp_gap_max": 0.5, "rollout_corr/ratio_max": 1.5, "actor/pg_loss": 3.0}])
    monkeypatch.setattr(up, "_policy_step", lambda state, mb, cfg: next(steps))

    class Rows:  # four sequences; a mini-batch of them is the same stand-in
        def __len__(self):
            return 4

        def index(self, idx):
            return self

    m = up.update(SimpleNamespace(critic=None, step=0), Rows(), load_config(None, ["algo.minibatches=2"]))
    assert m == {"rollout_corr/logp_gap_max": 0.5, "rollout_corr/ratio_max": 3.0, "actor/pg_loss": 2.0}


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize("override, key", [
    ("algo.rollout_correction=tis", "algo.rollout_correction"),
    ("algo.rollout_corr_cap=0.5", "algo.rollout_corr_cap"),
    ("algo.rollout_corr_cap=inf", "algo.rollout_corr_cap"),
    ("algo.rollout_corr_low=1.5", "algo.rollout_corr_low"),
    ("algo.rollout_corr_low=-0.1", "algo.rollout_corr_low"),
])
def test_bad_settings_name_their_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


# --------------------------------------------------------------------------- the generate backend, end to end


def test_generate_records_the_trainer_s_log_probs(tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    cfg = load_config(None, ["rollout.sampler=generate", "rollout.temperature=0.7", "rollout.max_new_tokens=6"])
    torch.manual_seed(0)
    batch = generate(model, tok, [[5, 6, 7], [8, 9]], group_size=2, max_new_tokens=6, temperature=0.7,
                     sampler="generate")
    assert batch.rollout_logp is not None
    with torch.no_grad():
        fresh = upd.batch_logprobs(model.eval(), batch, cfg)[0]
    act = batch.response_mask.bool()
    assert torch.all(batch.rollout_logp[~act] == 0)
    scale = 1 + float(fresh[act].abs().max())
    assert_rounding_close(batch.rollout_logp[act], fresh[act], n_terms=model_reduction_len(model, batch),
                          scale=scale, depth=FORWARD_DEPTH, what="generate vs forward log-probs")


def test_a_short_run_with_generate_and_the_correction_on(tmp_path, tiny_size_overrides, digit_reward):
    from rlft.stages.pipeline import run_pipeline
    from test_pipeline import quiet, read_jsonl

    keys = ["rollout_corr/logp_gap_mean", "rollout_corr/logp_gap_max", "rollout_corr/kl", "rollout_corr/masked_frac",
            "rollout_corr/ratio_max", "actor/pg_loss", "actor/grad_norm"]
    for mode, extra in (("seq_mis", ()), ("token_tis", ("algo.epochs=2",))):  # single pass, and recomputed old log-probs
        cfg = load_config(None, tiny_size_overrides(tmp_path, f"log.name={mode}", "data.synth_train_size=20",
                                                    "eval.ks=[1]", "eval.before_rl=false", "optim.warmup_steps=0",
                                                    "train.steps=2", "rollout.sampler=generate",
                                                    f"algo.rollout_correction={mode}", *digit_reward, *extra))
        records = read_jsonl(run_pipeline(cfg, echo=quiet).run_dir / "metrics.jsonl")
        assert len(records) == 2
        for rec in records:
            for key in keys:
                assert key in rec and math.isfinite(rec[key]), (mode, key, rec.get(key))
            # float32 generate against the float32 trainer: a rounding-sized gap, nothing masked
            assert rec["rollout_corr/logp_gap_max"] < 1e-3 and rec["rollout_corr/masked_frac"] == 0.0


def test_unknown_modes_and_an_empty_batch_are_told_apart():
    with pytest.raises(ValueError, match="unknown rollout correction 'tis'"):
        resolve("tis", exact=True)
    with pytest.raises(ValueError, match="unknown rollout correction 'auto'"):  # auto is resolved before weights
        correction_weights(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), "auto", 2.0, 0.5)
    assert gap_metrics([]) == {}  # no micro-batch had a token: no metric rather than 0 / 0
