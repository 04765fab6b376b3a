"""The whole RL update (``rlft.trainers.update.update``) against a naive reference written from the formulas.

Every term is on at once: the clipped policy loss with clip-higher and dual-clip, KL(pi || ref) in the loss (k3,
DeepSeekMath eq. 3-4), the entropy bonus, each of the five loss aggregations, and PPO's critic with its clipped
value loss; several passes (two mini-batches) so that the old log-probs differ from the current ones and the clip
bites. The reference is computed one sequence at a time from an unpadded forward, one token at a time, in plain
Python, from the documented objective of one mini-batch M (rows i, valid tokens t of ``loss_mask``):

    policy:  L = agg_M( pg_it + kl_coef * k3_it - entropy_coef * H_it )
             pg_it = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A), and for A < 0 (dual-clip)
                     -max(min(r A, clip(r) A), clip_c A)                 (PPO eq. 7, DAPO eq. 10, Ye et al. 2020)
             r = exp(logp - old_logp),  k3 = e^d - d - 1 with d = ref_logp - logp  (Schulman 2020; DeepSeekMath eq. 4)
             H = entropy of softmax(logits / temperature), the distribution the tokens were sampled from
             agg_M (rlft.core.losses): token-mean sum / #tokens of M; seq-mean-token-mean mean over the non-empty
             rows of M of per-row token means; seq-mean-token-sum the same of per-row sums;
             seq-mean-token-sum-norm sum / (|M| * rollout.max_new_tokens); token-sum the plain sum
    critic:  L_V = (1 / #tokens of M) sum_it 0.5 max((V - R)^2, (V_old + clip(V - V_old, -vf_clip, vf_clip) - R)^2)
             (rlft.core.value; the critic is a separate model with its own optimizer, so its loss has no
             coefficient relative to the policy's: its weight is critic.lr)

The reference gradient is the sum of the per-token, per-term gradients (autograd of each scalar term), each with
its weight in the mini-batch's aggregation. What ``update`` does is read from the optimizers (plain SGD at lr 0, so
both optimizer steps of the update start from the reference's weights) and from the metrics it returns, for
micro-batches of the whole mini-batch, of one row, of an uneven 2 + 1 split and of a token budget: a bug shared by
every split (a sign, a coefficient, a normaliser) moves them all away from the reference.
"""

from __future__ import annotations

import copy
import math
import types
from dataclasses import dataclass

import pytest
import torch

from numerics import FORWARD_DEPTH, MODEL_DEPTH, model_reduction_len, rounding_tol, unit_roundoff
from rlft.recipe import load_config
from rlft.core.kl import make_kl_controller
from rlft.core.losses import AGGREGATIONS
from rlft.models.critic import Critic
from rlft.models.loading import load_model, load_tokenizer
from rlft.rollout.batch import Batch
from rlft.trainers import update as upd
from rlft.trainers.state import PromptSampler, RLState
from test_rl_loop import RecordingSGD, varied_batch

T = 8  # generation budget of the hand-made batch (test_rl_loop.T), the max_len of seq-mean-token-sum-norm
CLIP_LOW, CLIP_HIGH, CLIP_C = 0.2, 0.28, 3.0
KL_COEF, ENT_COEF, VF_CLIP, TEMPERATURE = 0.1, 0.01, 0.2, 0.7
AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum"]
# 6 rows in 2 mini-batches of 3: micro-batches of the whole mini-batch, of 1 row, of 2 + 1 rows, and of a token
# budget (groups packed by length, rows reordered, each micro-batch trimmed to its own widths)
SPLITS = {"whole": ["train.micro_batch_size=3", "train.micro_batch_tokens=0"],
          "one_row": ["train.micro_batch_size=1", "train.micro_batch_tokens=0"],
          "uneven": ["train.micro_batch_size=2", "train.micro_batch_tokens=0"],
          "token_budget": ["train.micro_batch_size=256", "train.micro_batch_tokens=30"]}
FILTERED_ROW = 4  # a truncated row whose loss_mask is all 0 (DAPO overlong filter): its tokens carry no loss
MARGIN = 1e-4  # every branch of the reference (clip, dual-clip, value clip) is this far from its switch point


U32 = unit_roundoff(torch.float32)

# Tolerances (tests/numerics.py). The models are float64, their RMSNorms included (``_float64``), so the policy, its
# log-probs, entropies and every loss term are float64 in rlft and in the reference, and two evaluations differ only
# by float64 rounding: rounding_tol(n, scale, depth, float64) with n the longest reduction, depth MODEL_DEPTH for a
# gradient (FORWARD_DEPTH for a metric) and scale the sum of the absolute values of the per-token, per-term
# contributions (|weight| * |gradient of the term|), taken per parameter at its largest entry: about 1e-12 of the
# scale (measured: 1e-3 of the tolerance), where a wrong sign, coefficient or normaliser moves the result by a whole
# term (1e-4 to 1e-1 here, 1e9 to 1e11 times the tolerance).
# The critic's output is float32 whatever its weights (Critic.forward, _critic_step: ``values.float()``): rlft's
# V(s_t) carries a rounding error of at most u32 |V| and the gradient it back-propagates into V is itself cast to
# float32 (u32 |V - R|), so the critic's gradient gets the first-order term
# u32 * sum_t (|V_t| + |V_t - R_t|) |dV_t / dtheta| / N on top (doubled: second-order terms and the float64 ones),
# and its loss u32 * sum_t |V_t| |V_t - R_t| / N (doubled); measured: at most 0.65 of the first-order term, entry
# by entry, under ATEN_CPU_CAPABILITY=default and the vectorised kernels. The clip fractions are float32 means of
# flags (rlft's float32 mask). No branch (clip, dual-clip, value clip) is within MARGIN of its switch point
# (checked), so none of those roundings can pick another branch.


@dataclass
class Token:
    """One valid token of the reference: its per-term values, gradients (flattened over the parameters) and the
    magnitudes of its forward pass."""

    row: int
    pg: float
    kl: float
    ent: float
    vf: float
    clipped: bool  # the PPO clip is active (its gradient is 0): pg_clipfrac
    vf_clipped: bool  # the clipped value error is the larger one: vf_clipfrac
    fwd: float  # bound on the rounding scale of one token's metrics (see _reference_tokens)
    v_scale: float  # |V| |V - R|: the float32 rounding scale of its value loss
    g_pg: torch.Tensor
    g_kl: torch.Tensor
    g_ent: torch.Tensor
    g_vf: torch.Tensor  # critic parameters
    g_v32: torch.Tensor  # (|V| + |V - R|) |dV / d critic parameters|: the float32 rounding scale of its gradient


@dataclass
class Setup:
    tok: object
    policy: torch.nn.Module
    critic: torch.nn.Module
    batch: Batch
    tokens: list[Token]
    n_red: int  # longest reduction behind a gradient (numerics.model_reduction_len)


def _flat(grads, params) -> torch.Tensor:
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def _unflat(vec: torch.Tensor, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out, k = {}, 0
    for name, p in model.named_parameters():
        out[name] = vec[k:k + p.numel()].view_as(p)
        k += p.numel()
    assert k == len(vec)
    return out


def _policy_loss(logp: torch.Tensor, old: float, adv: float) -> tuple[torch.Tensor, bool, float]:
    """(-J of one token, clip active, its switch-point distance), branch by branch (not max/min of tensors):
    J = min(r A, clip(r) A) = A min(r, 1 + clip_high) for A >= 0 and A max(r, 1 - clip_low) for A < 0, where
    dual-clip makes it max(J, clip_c A), i.e. clip_c A once r > clip_c."""
    r = torch.exp(logp - old)
    rv = r.item()
    if adv >= 0:
        if rv > 1 + CLIP_HIGH:
            return -adv * (1 + CLIP_HIGH) + 0 * r, True, rv - 1 - CLIP_HIGH  # a constant: gradient 0
        return -adv * r, False, 1 + CLIP_HIGH - rv
    if rv > CLIP_C:
        return -CLIP_C * adv + 0 * r, False, rv - CLIP_C  # the dual-clip cap, a constant
    if rv < 1 - CLIP_LOW:
        return -adv * (1 - CLIP_LOW) + 0 * r, True, min(1 - CLIP_LOW - rv, CLIP_C - rv)
    return -adv * r, False, min(rv - 1 + CLIP_LOW, CLIP_C - rv)


def _value_loss(v: torch.Tensor, v_old: float, ret: float) -> tuple[torch.Tensor, bool, float]:
    """(0.5 max((V - R)^2, (V_clipped - R)^2) of one token, clipped error larger, switch-point distance)."""
    err = (v - ret) ** 2
    dv = v.item() - v_old
    if abs(dv) <= VF_CLIP:  # V_clipped == V: the two errors are one
        return 0.5 * err, False, VF_CLIP - abs(dv)
    err_clip = (v_old + math.copysign(VF_CLIP, dv) - ret) ** 2  # a constant: the clamp is active
    margin = min(abs(dv) - VF_CLIP, abs(err_clip - err.item()))
    if err_clip > err.item():
        return 0.5 * err_clip + 0 * v, True, margin
    return 0.5 * err, False, margin


def _row_forward(policy, critic, batch: Batch, i: int):
    """Unpadded single-sequence forwards of row i: policy logits / temperature (n, V) and critic values (n,) at the
    positions that predict its n response tokens (the state s_t before token t), and the tokens (n,)."""
    prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()]
    resp = batch.response_ids[i][batch.response_mask[i].bool()]
    seq = torch.cat([prompt, resp])[None]
    pos = slice(len(prompt) - 1, len(prompt) - 1 + len(resp))
    logits = policy(input_ids=seq).logits[0, pos] / TEMPERATURE  # (n, V)
    values = critic.head(critic.backbone(input_ids=seq).last_hidden_state[0, pos])[:, 0]  # (n,) float64
    return logits, values, resp


def _make_batch(tok, policy, critic) -> Batch:
    """test_rl_loop's varied batch (eos early and late, truncated, empty rows; three prompts x G=2) with per-token
    advantages, old and reference log-probs away from the current policy (so the clip, the dual-clip and the KL
    bite), rollout values and returns, a filtered row, and junk at every position that carries no loss."""
    batch = varied_batch(tok)
    g = torch.Generator().manual_seed(3)
    B = len(batch)
    batch.scores = torch.arange(B, dtype=torch.float64)  # names each row (update reads it only for lm_coef > 0)
    assert batch.response_mask[FILTERED_ROW].sum() == T
    batch.loss_mask = batch.response_mask.clone()
    batch.loss_mask[FILTERED_ROW] = 0
    logp = torch.zeros(B, T, dtype=torch.float64)
    values = torch.zeros(B, T, dtype=torch.float64)
    with torch.no_grad():
        for i in range(B):
            logits, v, resp = _row_forward(policy, critic, batch, i)
            logp[i, :len(resp)] = torch.log_softmax(logits, -1).gather(-1, resp[:, None])[:, 0]
            values[i, :len(resp)] = v

    def randn(scale: float) -> torch.Tensor:
        return scale * torch.randn(B, T, generator=g, dtype=torch.float64)

    valid = batch.loss_mask.bool()
    log_ratio, adv = randn(0.5), randn(1.0)
    adv[0, 1], log_ratio[0, 1] = -1.5, 1.5  # r = 4.5 > clip_c with A < 0: the dual-clip cap
    batch.adv = torch.where(valid, adv, randn(3.0))
    batch.old_logp = torch.where(valid, logp - log_ratio, randn(3.0))
    batch.ref_logp = torch.where(valid, logp + randn(0.3), randn(3.0))
    batch.values = torch.where(valid, values + randn(0.3), randn(3.0))
    batch.ret = torch.where(valid, values + randn(0.5), randn(3.0))
    return batch


def _reference_tokens(policy, critic, batch: Batch) -> list[Token]:
    """Every valid token's terms and their gradients, one scalar autograd at a time; checks the branch margins."""
    p_params = [p for p in policy.parameters() if p.requires_grad]
    c_params = [p for p in critic.parameters() if p.requires_grad]
    log_vocab = math.log(policy.config.vocab_size)
    tokens, branches = [], set()

    def grad(y, params):
        return _flat(torch.autograd.grad(y, params, retain_graph=True, allow_unused=True), params)

    for i in range(len(batch)):
        if not batch.loss_mask[i].any():
            continue
        logits, values, resp = _row_forward(policy, critic, batch, i)
        for t in range(len(resp)):
            if not batch.loss_mask[i, t]:
                continue
            adv, ret = batch.adv[i, t].item(), batch.ret[i, t].item()
            log_probs = torch.log_softmax(logits[t], -1)  # (V,)
            logp = log_probs[resp[t]]
            pg, clipped, margin = _policy_loss(logp, batch.old_logp[i, t].item(), adv)
            d = batch.ref_logp[i, t].item() - logp  # log ref/pi
            kl = torch.exp(d) - d - 1.0  # k3
            ent = -(log_probs.exp() * log_probs).sum()  # H of softmax(logits / temperature)
            vf, vf_clipped, vf_margin = _value_loss(values[t], batch.values[i, t].item(), ret)
            assert margin > MARGIN and vf_margin > MARGIN, (i, t, margin, vf_margin)
            r = math.exp(logp.item() - batch.old_logp[i, t].item())
            branches.add("dual" if r > CLIP_C and adv < 0 else "clip" if clipped else "inside")
            branches.add(f"vf_{vf_clipped}_{abs(values[t].item() - batch.values[i, t].item()) > VF_CLIP}")
            # the size of the numbers behind one token's log-prob and entropy (logits, log V), times how much
            # each term moves with its log-prob
            size = 1 + logits[t].abs().max().item() + log_vocab
            fwd = (abs(pg.item()) + abs(adv) * r * size + abs(kl.item()) + abs(math.exp(d.item()) - 1) * size
                   + 2 * size)
            v, v_err = values[t].item(), values[t].item() - ret
            tokens.append(Token(i, pg.item(), kl.item(), ent.item(), vf.item(), clipped, vf_clipped, fwd,
                                abs(v) * abs(v_err), grad(pg, p_params), grad(kl, p_params), grad(ent, p_params),
                                grad(vf, c_params), (abs(v) + abs(v_err)) * grad(values[t], c_params).abs()))
    # every branch is exercised: inside, clipped, dual-clipped; value inside the clip range, clamped and losing,
    # clamped and winning
    assert branches == {"inside", "clip", "dual", "vf_False_False", "vf_False_True", "vf_True_True"}, branches
    return tokens


def _rms_norm_float64(self, hidden: torch.Tensor) -> torch.Tensor:
    """RMSNorm in the dtype of its input (transformers' LlamaRMSNorm casts to float32 and back)."""
    return self.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _float64(model: torch.nn.Module) -> torch.nn.Module:
    """The model in float64 throughout: its weights, and its RMSNorms, which transformers computes in float32 (the
    float32 rounding of their backward would otherwise set the tolerance). A change of the model's function, the
    same for rlft and the reference, which only compare the update around it. Rotary embeddings stay float32 but
    are constants of the positions, the same on both sides."""
    model = model.double()
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    assert norms and all(hasattr(m, "variance_epsilon") for m in norms), "the tiny model's norms changed"
    for m in norms:
        m.forward = types.MethodType(_rms_norm_float64, m)  # this instance only (deepcopy keeps it)
    return model


@pytest.fixture(scope="module")
def setup(tiny_model_dir) -> Setup:
    tok = load_tokenizer(str(tiny_model_dir))
    policy = _float64(load_model(str(tiny_model_dir)))  # rlft and the reference then agree to ~1e-15
    critic = _float64(Critic(copy.deepcopy(policy.base_model)))  # as run.build_critic: the policy's backbone
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # a value head that is not 0, so that the backbone's gradient is not 0 either
        critic.head.weight.copy_(0.3 * torch.randn(critic.head.weight.shape, generator=g, dtype=torch.float64))
        critic.head.bias.fill_(0.1)
    batch = _make_batch(tok, policy, critic)
    return Setup(tok, policy, critic, batch, _reference_tokens(policy, critic, batch),
                 model_reduction_len(policy, batch))


class Reference:
    """The reference's gradients, metrics and rounding scales of one mini-batch (its rows) under ``agg``."""

    def __init__(self, s: Setup, rows: list[int], agg: str):
        toks = [k for k in s.tokens if k.row in rows]
        n = len(toks)  # valid tokens of the mini-batch
        per_row = {r: sum(k.row == r for k in toks) for r in rows}
        nonempty = sum(c > 0 for c in per_row.values())
        weight = {"token-mean": lambda k: 1 / n,  # DAPO eq. 12
                  "seq-mean-token-mean": lambda k: 1 / (nonempty * per_row[k.row]),  # DeepSeekMath eq. 3
                  "seq-mean-token-sum": lambda k: 1 / nonempty,
                  "seq-mean-token-sum-norm": lambda k: 1 / (len(rows) * T),  # Dr. GRPO §3.1: B * max_len
                  "token-sum": lambda k: 1.0}[agg]  # the plain sum over valid tokens
        self.grad = sum(weight(k) * (k.g_pg + KL_COEF * k.g_kl - ENT_COEF * k.g_ent) for k in toks)
        self.grad_scale = sum(weight(k) * (k.g_pg.abs() + KL_COEF * k.g_kl.abs() + ENT_COEF * k.g_ent.abs())
                              for k in toks)
        self.critic_grad = sum(k.g_vf for k in toks) / n
        self.critic_scale = sum(k.g_vf.abs() for k in toks) / n
        self.critic_scale32 = sum(k.g_v32 for k in toks) / n
        self.metrics = {"actor/pg_loss": sum(weight(k) * k.pg for k in toks),
                        "actor/kl_loss": sum(weight(k) * k.kl for k in toks),
                        "actor/kl_seq": sum(k.kl for k in toks) / len(rows),  # KL per sequence (the controller's)
                        "actor/entropy": sum(k.ent for k in toks) / n,  # a token mean, whatever the aggregation
                        "actor/pg_clipfrac": sum(k.clipped for k in toks) / n,
                        "critic/vf_loss": sum(k.vf for k in toks) / n,
                        "critic/vf_clipfrac": sum(k.vf_clipped for k in toks) / n}
        # a metric weighs each token by at most max(weight, 1/n, 1/|rows|); Token.fwd bounds the size of its terms
        # and of how far each moves with the rounding of its forward pass
        self.metric_scales = {key: sum(max(weight(k), 1 / n, 1 / len(rows)) * k.fwd for k in toks)
                              for key in self.metrics}
        self.metric_scales["critic/vf_loss"] = sum(abs(k.vf) for k in toks) / n
        self.vf_scale32 = sum(k.v_scale for k in toks) / n


def _config(tiny_overrides, run_dir, agg: str, split: list[str]):
    return load_config(None, tiny_overrides(
        run_dir, f"rollout.max_new_tokens={T}", f"rollout.temperature={TEMPERATURE}", "optim.grad_clip=0",
        "critic.grad_clip=0", "algo.advantage=gae", "algo.policy_loss=clip", f"algo.loss_agg={agg}",
        f"algo.clip_low={CLIP_LOW}", f"algo.clip_high={CLIP_HIGH}", f"algo.clip_c={CLIP_C}",
        f"algo.kl_coef={KL_COEF}", "algo.kl_in=loss", "algo.kl_estimator=k3", f"algo.entropy_coef={ENT_COEF}",
        f"algo.vf_clip={VF_CLIP}", "algo.epochs=1", "algo.minibatches=2", *split))


def _run_update(s: Setup, cfg, monkeypatch):
    """``update`` on copies of the setup's models with plain SGD at lr 0 (the weights never move, so both optimizer
    steps start from the reference's); returns the rows, policy and critic gradients of each step, and the
    metrics."""
    def sgd(model):
        opt = RecordingSGD(model, lr=0.0)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)

    policy, critic = copy.deepcopy(s.policy), copy.deepcopy(s.critic)
    opt, sched = sgd(policy)
    state = RLState(policy=policy, tokenizer=s.tok, optimizer=opt, scheduler=sched, sampler=PromptSampler(1, 0),
                    examples=[], prompts=[])
    state.critic = critic
    state.critic_optimizer, state.critic_scheduler = sgd(critic)
    state.kl_ctl = make_kl_controller(cfg.algo.kl_coef, cfg.algo.kl_target, cfg.algo.kl_horizon)  # as run.build_rl_state
    rows: list[list[int]] = []
    micros: list[int] = []
    policy_step = upd._policy_step

    def recording(state, mb, cfg):  # which rows each mini-batch holds (batch.scores names them), in how many micros
        rows.append([int(x) for x in mb.scores.tolist()])
        micros.append(len(list(upd.micro_batches(mb, cfg.train.micro_batch_size, cfg.train.micro_batch_tokens,
                                                 upd.shares_prefix(state.policy, cfg)))))
        return policy_step(state, mb, cfg)

    monkeypatch.setattr(upd, "_policy_step", recording)
    metrics = upd.update(state, copy.deepcopy(s.batch), cfg)
    monkeypatch.setattr(upd, "_policy_step", policy_step)
    grads = [(torch.cat([gp[n].reshape(-1) for n in state.optimizer.names]),
              torch.cat([gc[n].reshape(-1) for n in state.critic_optimizer.names]))
             for gp, gc in zip(state.optimizer.grads, state.critic_optimizer.grads)]
    return rows, micros, grads, metrics


def _assert_close(got: torch.Tensor, want: torch.Tensor, tol: torch.Tensor, model, what: str) -> None:
    """Per parameter: max |got - want| <= the parameter's tolerance (that of its largest-scale entry)."""
    wants, tols = _unflat(want, model), _unflat(tol, model)
    for name, g in _unflat(got, model).items():
        diff, t = (g - wants[name]).abs().max().item(), tols[name].max().item()
        assert diff <= t, f"{what} {name}: differs by {diff:.3g} from the reference, over the tolerance {t:.3g}"


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("agg", AGGS)
def test_update_equals_the_naive_reference(setup, tiny_overrides, tmp_path, monkeypatch, agg, split):
    """Each optimizer step's policy and critic gradients and the update's loss metrics are those of the documented
    objective of its mini-batch, computed naively, for every micro-batch split."""
    s = setup
    cfg = _config(tiny_overrides, tmp_path, agg, SPLITS[split])
    rows, micros, grads, metrics = _run_update(s, cfg, monkeypatch)
    assert len(rows) == len(grads) == 2 and sorted(rows[0] + rows[1]) == list(range(len(s.batch)))
    if split == "token_budget":  # the budget splits both mini-batches (into 3 and 2 micro-batches today)
        assert all(m > 1 for m in micros), micros
    else:
        assert micros == {"whole": [1, 1], "one_row": [3, 3], "uneven": [2, 2]}[split]
    refs = [Reference(s, r, agg) for r in rows]
    for step, ((g_policy, g_critic), ref) in enumerate(zip(grads, refs)):
        assert ref.grad.abs().max() > 0 and ref.critic_grad.abs().max() > 0
        tol = _scale_tol(ref.grad_scale, s.policy, s.n_red)
        _assert_close(g_policy, ref.grad, tol, s.policy, f"step {step} (rows {rows[step]}) policy gradient")
        tol_c = _scale_tol(ref.critic_scale, s.critic, s.n_red) + 2 * U32 * _per_param_max(ref.critic_scale32,
                                                                                            s.critic)
        _assert_close(g_critic, ref.critic_grad, tol_c, s.critic, f"step {step} (rows {rows[step]}) critic gradient")
    for key in refs[0].metrics:  # update averages the metrics of its optimizer steps
        want = sum(r.metrics[key] for r in refs) / len(refs)
        tol = sum(rounding_tol(s.n_red, r.metric_scales[key], depth=FORWARD_DEPTH, dtype=torch.float64)
                  for r in refs) / len(refs)
        if key == "critic/vf_loss":
            tol += sum(2 * U32 * r.vf_scale32 for r in refs) / len(refs)
        if key.endswith("clipfrac"):  # means of flags in float32 (rlft's float32 mask): per micro-batch, then summed
            tol = rounding_tol(len(s.tokens), 1.0, depth=2, dtype=torch.float32)
        assert abs(metrics[key] - want) <= tol, f"{key}: {metrics[key]!r} where the reference gives {want!r}"


def _per_param_max(scale: torch.Tensor, model) -> torch.Tensor:
    """Each parameter's entries set to that parameter's largest scale (numerics.AbsGradSum.scale's convention)."""
    return torch.cat([torch.full((v.numel(),), v.max().item(), dtype=torch.float64)
                      for v in _unflat(scale, model).values()])


def _scale_tol(scale: torch.Tensor, model, n_red: int) -> torch.Tensor:
    """numerics.rounding_tol in float64 of a gradient whose per-entry scale is ``scale``, per parameter."""
    return _per_param_max(scale, model) * rounding_tol(n_red, 1.0, depth=MODEL_DEPTH, dtype=torch.float64)


def test_the_reference_knows_every_aggregation():
    """A new aggregation needs its weights in Reference before this file covers it."""
    assert sorted(AGGS) == sorted(AGGREGATIONS.names())
