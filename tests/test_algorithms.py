"""Every preset and every trainer switch of issue 3, end to end on the tiny model, plus the orchestration pieces."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlft.recipe import load_config
from rlft.models.critic import Critic, load_critic
from rlft.models.loading import load_model, load_tokenizer
from rlft.recipe.presets import PRESETS
from rlft.rollout.batch import Batch, cat_batches
from rlft.stages.pipeline import run_pipeline
from rlft.trainers import rl
from numerics import FORWARD_DEPTH, assert_rounding_close
from test_pipeline import check_metrics, quiet, read_jsonl

CRITIC_KEYS = ["critic/vf_loss", "critic/vf_explained_var", "critic/values/mean", "critic/returns/mean",
               "critic/grad_norm", "critic/lr"]


def finite_keys(records: list[dict], keys: list[str]) -> None:
    for rec in records:
        for key in keys:
            assert key in rec, key
            assert math.isfinite(rec[key]), (key, rec[key])


@pytest.fixture
def run(tmp_path, tiny_size_overrides, digit_reward):
    """run(*overrides) -> (run_dir, metrics records, cfg) of a 3-step demo run on the tiny model."""

    def go(*extra: str, name: str = "r"):
        cfg = load_config(None, tiny_size_overrides(tmp_path, f"log.name={name}", "data.synth_train_size=20",
                                                    "eval.ks=[1]", "eval.before_rl=false", "optim.warmup_steps=0",
                                                    *digit_reward, *extra))
        run_dir = run_pipeline(cfg, echo=quiet).run_dir
        records = read_jsonl(run_dir / "metrics.jsonl")
        assert [r["step"] for r in records] == list(range(1, cfg.train.steps + 1))
        check_metrics(records, cfg)
        return run_dir, records, cfg

    return go


@pytest.mark.parametrize("preset", PRESETS.names())
def test_every_preset_trains(run, preset):
    extra = ["critic.lr=1e-3"] if preset in ("ppo", "vapo") else []
    run_dir, records, cfg = run(f"algo={preset}", *extra)
    assert cfg.algo.name == preset
    if cfg.algo.needs_critic:
        finite_keys(records, CRITIC_KEYS)
        critic = load_critic(str(run_dir / "critic"))  # saved and loadable
        assert isinstance(critic, Critic)
    if cfg.algo.kl_in == "reward":
        finite_keys(records, ["actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"])
    if cfg.algo.dynamic_sampling:
        finite_keys(records, ["dynamic_sampling/groups_drawn", "dynamic_sampling/groups_kept"])
    if cfg.algo.lm_coef > 0:
        finite_keys(records, ["actor/lm_loss"])


@pytest.mark.parametrize("preset", ["ppo", "vapo"])
def test_critic_presets_train_under_bfloat16_autocast(run, preset):
    """model.autocast=bfloat16 with a critic (values under autocast, the value loss in float32)."""
    _, records, _ = run(f"algo={preset}", "critic.lr=1e-3", "model.autocast=bfloat16")
    finite_keys(records, CRITIC_KEYS)


@pytest.mark.parametrize("preset, coef_key, beta", [("ppo", "actor/reward_kl_penalty_coeff", 0.05),  # KL in reward
                                                     ("grpo", "actor/kl_coef", 0.04)])  # KL in the loss
def test_adaptive_kl_coefficient_moves(run, preset, coef_key, beta):
    _, records, _ = run(f"algo={preset}", "algo.kl_target=1e-6", "algo.kl_horizon=10", "optim.lr=1e-2",
                        "train.steps=4")
    coefs = [r[coef_key] for r in records]
    kls = [r["actor/kl_seq"] for r in records]  # the KL per sequence each step measured
    assert coefs[0] == pytest.approx(beta)
    n, target, horizon = 2 * 2, 1e-6, 10  # P x G sequences per update
    for i in range(len(records) - 1):  # Ziegler et al. 2019: beta *= 1 + clip(KL / target - 1, +-0.2) * n / horizon
        err = min(max(kls[i] / target - 1, -0.2), 0.2)
        assert coefs[i + 1] == pytest.approx(coefs[i] * (1 + err * n / horizon))
    # step 1 samples the policy that is still the reference: its KL is rounding (two forward passes of the same
    # weights), far below the KL once the policy has moved (0.07-0.24 here); a wrong reference is of that size
    assert max(kls) > 1e-2
    assert abs(kls[0]) < 1e-3 * max(kls)
    assert coefs[1] < coefs[0]  # below target: beta shrinks
    assert any(b > a for a, b in zip(coefs, coefs[1:]))  # above target, once moved: it grows


def test_overlong_punishment_and_filter(run):
    _, records, _ = run("algo.overlong_buffer_frac=1.0", "algo.overlong_filter=true")
    finite_keys(records, ["reward/overlong_penalty/mean", "actor/overlong_filtered_frac"])
    assert all(-1.0 <= r["reward/overlong_penalty/mean"] <= 0.0 for r in records)
    assert any(r["reward/overlong_penalty/mean"] < 0 for r in records)  # L_cache = L_max: every length is punished


def test_ptx_loss(run, tmp_path):
    texts = tmp_path / "ptx.jsonl"
    texts.write_text("".join(json.dumps({"text": f"max(1,2,{i})=? #### {max(2, i)}"}) + "\n" for i in range(5)))
    _, records, _ = run("algo.ptx_coef=0.5", f"data.ptx_source={texts}", "train.ptx_batch_size=2")
    finite_keys(records, ["actor/ptx_loss"])
    assert all(r["actor/ptx_loss"] > 0 for r in records)


def test_train_logprob_chunk_reaches_the_ptx_term(run, tmp_path, monkeypatch):
    import rlft.trainers.update as update

    seen = []
    real = update.lm_loss_sum
    monkeypatch.setattr(update, "lm_loss_sum", lambda *a, **k: seen.append(k.get("chunk")) or real(*a, **k))
    texts = tmp_path / "ptx.jsonl"
    texts.write_text("".join(json.dumps({"text": f"max(1,2,{i})=? #### {max(2, i)}"}) + "\n" for i in range(5)))
    run("algo.ptx_coef=0.5", f"data.ptx_source={texts}", "train.ptx_batch_size=2", "train.logprob_chunk=7")
    assert seen and set(seen) == {7}


def test_ptx_rows_without_text_name_the_row(run, tmp_path):
    from rlft.data.schema import DataError

    texts = tmp_path / "ptx.jsonl"
    texts.write_text(json.dumps({"text": "fine text"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    with pytest.raises(DataError, match=r"row 1 .*'text'"):
        run("algo.ptx_coef=0.5", f"data.ptx_source={texts}")


def test_value_pretraining_updates_only_the_critic(run):
    run_dir, records, cfg = run("algo=vapo", "critic.lr=1e-2", "critic.pretrain_steps=2", "train.steps=1")
    pre = read_jsonl(run_dir / "critic_pretrain_metrics.jsonl")
    assert [r["step"] for r in pre] == [1, 2]
    finite_keys(pre, ["critic/vf_loss", "critic/vf_explained_var"])


def test_pretraining_step_leaves_the_policy_alone(tiny_model_dir, tmp_path, tiny_size_overrides, digit_reward):
    from rlft.data.templates import encode_prompts
    from rlft.trainers.rl_setup import build_rl_state
    from rlft.data.task import load_task

    cfg = load_config(None, tiny_size_overrides(tmp_path, "algo=vapo", "critic.lr=1e-2", "data.synth_train_size=20",
                                                *digit_reward))
    tok = load_tokenizer(str(tiny_model_dir))
    policy = load_model(str(tiny_model_dir))
    train_ex, _ = load_task(cfg)
    state = build_rl_state(policy, tok, train_ex, encode_prompts(train_ex, "chat", tok, 512, "t"), cfg)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    head_before = state.critic.head.bias.detach().clone()
    m = rl.rl_step(state, cfg, train_policy=False)
    assert state.step == 0 and "actor/pg_loss" not in m
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert not torch.equal(head_before, state.critic.head.bias)  # the critic learned


# ----------------------------------------------------------------------------- dynamic sampling


class _ScriptedScores:
    """Stands in for ``rl.score``: round r of generation gets scores ``rounds[r]`` (one list per group)."""

    def __init__(self, rounds: list[list[list[float]]]):
        self.rounds, self.calls = rounds, 0

    def __call__(self, batch: Batch, examples, cfg, step: int = 1):
        from rlft.rewards.scoring import ScoreResult

        flat = [s for group in self.rounds[self.calls] for s in group]
        self.calls += 1
        batch.scores = torch.tensor(flat, dtype=torch.float32)
        return ScoreResult(total=flat, per_fn={"scripted": flat}, errors={})


@pytest.fixture
def ds_state(tiny_model_dir, tmp_path, tiny_size_overrides):
    from rlft.data.templates import encode_prompts
    from rlft.trainers.rl_setup import build_rl_state
    from rlft.data.task import load_task

    def make(rounds: list, max_rounds: int):
        cfg = load_config(None, tiny_size_overrides(tmp_path, "algo=dapo", "train.prompts_per_step=2",
                                                    "algo.group_size=2", f"algo.max_sample_rounds={max_rounds}",
                                                    "data.synth_train_size=20"))
        tok = load_tokenizer(str(tiny_model_dir))
        train_ex, _ = load_task(cfg)
        state = build_rl_state(load_model(str(tiny_model_dir)), tok, train_ex,
                          encode_prompts(train_ex, "chat", tok, 512, "t"), cfg)
        return state, cfg

    return make


def test_dynamic_sampling_keeps_only_informative_groups(ds_state, monkeypatch):
    script = _ScriptedScores([[[1, 1], [0, 1]], [[0, 0], [1, 0]], [[1, 0], [0, 1]]])
    monkeypatch.setattr(rl, "score", script)
    state, cfg = ds_state(script.rounds, max_rounds=5)
    batch, m = rl.collect(state, cfg, {})
    assert script.calls == 2  # stopped as soon as P=2 informative groups were kept
    assert batch.scores.tolist() == [0, 1, 1, 0]  # the mixed group of each round, whole and in order
    assert (m["dynamic_sampling/rounds"], m["dynamic_sampling/groups_drawn"], m["dynamic_sampling/groups_kept"]) == (
        2, 4, 2)
    assert m["reward/mean"] == pytest.approx(4 / 8)  # reward metrics describe every sample drawn
    assert m["frac_reward_zero_std"] == pytest.approx(2 / 4)


def test_dynamic_sampling_stops_after_its_round_limit(ds_state, monkeypatch):
    script = _ScriptedScores([[[1, 1], [0, 0]]] * 10)
    monkeypatch.setattr(rl, "score", script)
    state, cfg = ds_state(script.rounds, max_rounds=2)
    batch, m = rl.collect(state, cfg, {})
    assert script.calls == 3  # one round plus two extra
    assert m["dynamic_sampling/groups_kept"] == 0
    assert len(batch) == 4  # nothing informative: the last round, whose advantages are all 0
    adv_metrics = rl.compute_advantages(state, batch, cfg)
    assert adv_metrics == {} and torch.count_nonzero(batch.adv) == 0


def test_dynamic_sampling_trims_to_p_groups(ds_state, monkeypatch):
    script = _ScriptedScores([[[1, 0], [2, 3]], [[5, 6], [7, 8]]])
    monkeypatch.setattr(rl, "score", script)
    state, cfg = ds_state(script.rounds, max_rounds=3)
    batch, m = rl.collect(state, cfg, {})
    assert script.calls == 1 and batch.scores.tolist() == [1, 0, 2, 3]


# ----------------------------------------------------------------------------- pieces


def test_cat_batches_repads_and_keeps_every_sequence():
    def b(prompt_len: int, resp_len: int, fill: int) -> Batch:
        return Batch(prompt_ids=torch.full((2, prompt_len), fill), prompt_mask=torch.ones(2, prompt_len, dtype=torch.long),
                     response_ids=torch.full((2, resp_len), fill + 1),
                     response_mask=torch.ones(2, resp_len, dtype=torch.long), truncated=torch.tensor([True, False]),
                     group_size=2, texts=[f"{fill}a", f"{fill}b"], scores=torch.tensor([1.0, 2.0]))

    out = cat_batches([b(3, 2, 10), b(1, 4, 20)])
    assert out.prompt_ids.shape == (4, 3) and out.response_ids.shape == (4, 4)
    assert out.prompt_mask.tolist()[2] == [0, 0, 1] and out.prompt_ids[2, -1] == 20  # prompts padded on the left
    assert out.response_mask.tolist()[0] == [1, 1, 0, 0] and out.response_ids[0, 0] == 11  # responses on the right
    assert out.texts == ["10a", "10b", "20a", "20b"] and out.truncated.tolist() == [True, False, True, False]
    assert out.scores.tolist() == [1, 2, 1, 2] and out.adv is None
    with pytest.raises(ValueError, match="group sizes"):
        cat_batches([b(1, 1, 0), Batch(**{**b(1, 1, 0).__dict__, "group_size": 1})])


def test_critic_values_match_single_sequence_forwards(tiny_model_dir):
    critic = load_critic(str(tiny_model_dir))
    torch.nn.init.normal_(critic.head.weight, std=0.5)  # a non-trivial head
    prompts = [[5, 6, 7], [8]]
    responses = [[9, 10], [11, 12, 13]]
    p_ids = torch.tensor([[5, 6, 7], [0, 0, 8]])
    p_mask = torch.tensor([[1, 1, 1], [0, 0, 1]])
    r_ids = torch.tensor([[9, 10, 0], [11, 12, 13]])
    r_mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    with torch.no_grad():
        batched = critic.values(p_ids, p_mask, r_ids, r_mask)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            hidden = critic.backbone(input_ids=torch.tensor([p + r])).last_hidden_state[0]  # (L, H)
            states = hidden[len(p) - 1:len(p) - 1 + len(r)]  # (len(r), H): the state before each token
            want = critic.head(states).squeeze(-1)
            # the value is a forward pass ending in the head's dot product: scale = sum_i |w_i h_i|
            scale = (states.abs() @ critic.head.weight.abs().T).max() + critic.head.bias.abs().max()
            n = max(critic.head.in_features, len(p) + len(r))
            assert_rounding_close(batched[i, :len(r)], want, n_terms=n, scale=scale, depth=FORWARD_DEPTH,
                                  what=f"values of row {i}")


def test_new_critic_starts_at_zero_and_shares_no_weights(tiny_model_dir, tmp_path, tiny_size_overrides):
    from rlft.trainers.rl_setup import build_critic

    policy = load_model(str(tiny_model_dir))
    cfg = load_config(None, tiny_size_overrides(tmp_path, "algo=ppo"))
    critic = build_critic(policy, cfg)
    v = critic.values(torch.tensor([[5, 6]]), torch.ones(1, 2, dtype=torch.long), torch.tensor([[7]]),
                      torch.ones(1, 1, dtype=torch.long))
    assert v.abs().max() == 0
    policy_ptrs = {p.data_ptr() for p in policy.parameters()}
    assert not policy_ptrs & {p.data_ptr() for p in critic.parameters()}


def kl_in_reward_batch() -> Batch:
    """One group of 2 with scores 1, 1, a masked token holding junk, and old/ref log-probs whose k1 per token is
    row 0 [0.5, 0] and row 1 [1, 1, 1]."""
    batch = Batch(prompt_ids=torch.zeros(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1, dtype=torch.long),
                  response_ids=torch.zeros(2, 3, dtype=torch.long), response_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]),
                  truncated=torch.tensor([False, False]), group_size=2, scores=torch.tensor([1.0, 1.0]))
    batch.old_logp = torch.tensor([[-1.0, -1.0, 9.0], [-1.0, -1.0, -1.0]])
    batch.ref_logp = torch.tensor([[-1.5, -1.0, 0.0], [-2.0, -2.0, -2.0]])
    return batch


def test_kl_in_reward_shifts_group_outcomes(ds_state, monkeypatch):
    from rlft.recipe import load_config as lc

    state, _ = ds_state([], max_rounds=0)
    cfg = lc(None, ["algo=rloo", "algo.group_size=2", "algo.kl_coef=0.5"])
    from rlft.core.kl import make_kl_controller

    state.kl_ctl = make_kl_controller(0.5, 0.0, 1)
    batch = kl_in_reward_batch()
    m = rl.compute_advantages(state, batch, cfg)
    # k1 per token: row 0 [0.5, 0], row 1 [1, 1, 1]; outcome = 1 - 0.5 * sum -> [0.75, -0.5]; RLOO -> +-1.25
    assert m["actor/reward_kl_penalty"] == pytest.approx(3.5 / 5)
    assert m["actor/kl_seq"] == pytest.approx((0.5 + 3.0) / 2)
    torch.testing.assert_close(batch.adv[:, 0], torch.tensor([1.25, -1.25]))
    assert batch.adv[0, 2] == 0


def test_reinforce_pp_baseline_config_and_training(run):
    from rlft.config import ConfigError
    from rlft.recipe import load_config as lc

    a = lc(None, ["algo.advantage=reinforce_pp_baseline", "algo.group_size=4"]).algo
    assert a.uses_groups and a.sequence_constant_adv and not a.needs_critic
    assert lc(None, ["algo.advantage=reinforce_pp_baseline", "algo.policy_loss=gspo"]).algo.policy_loss == "gspo"
    with pytest.raises(ConfigError, match="algo.group_size: must be >= 2 with advantage 'reinforce_pp_baseline'"):
        lc(None, ["algo.advantage=reinforce_pp_baseline", "algo.group_size=1"])
    # the paper's setting: KL (k2) in the reward, group sampling, clipped ratio (REINFORCE++ w/ baseline)
    _, records, cfg = run("algo.advantage=reinforce_pp_baseline", "algo.kl_in=reward", "algo.kl_coef=0.01",
                          "algo.kl_estimator=k2")
    assert cfg.algo.group_size == 2
    finite_keys(records, ["actor/pg_loss", "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"])


def test_reinforce_pp_baseline_through_the_trainer(ds_state):
    from rlft.recipe import load_config as lc
    from rlft.core.kl import make_kl_controller

    state, _ = ds_state([], max_rounds=0)
    cfg = lc(None, ["algo.advantage=reinforce_pp_baseline", "algo.group_size=2", "algo.kl_in=reward",
                    "algo.kl_coef=0.5", "algo.kl_estimator=k1"])
    state.kl_ctl = make_kl_controller(0.5, 0.0, 1)
    batch = kl_in_reward_batch()
    rl.compute_advantages(state, batch, cfg)
    # k1 per token: row 0 [0.5, 0], row 1 [1, 1, 1]; R = 1 - 0.5 * sum -> [0.75, -0.5]; group mean 0.125 ->
    # centred [0.625, -0.625] on 2 + 3 tokens: token mean -0.125, unbiased variance (2 * 0.75^2 + 3 * 0.5^2) / 4
    sd = math.sqrt((2 * 0.75**2 + 3 * 0.5**2) / 4 + 1e-8)
    torch.testing.assert_close(batch.adv, torch.tensor([[0.75 / sd, 0.75 / sd, 0.0], [-0.5 / sd] * 3]))
    torch.testing.assert_close(batch.ret, torch.tensor([[0.75, 0.75, 0.0], [-0.5] * 3]))


def test_time_budget_stops_rl(tmp_path, tiny_size_overrides):
    lines: list[str] = []
    cfg = load_config(None, tiny_size_overrides(tmp_path, "log.name=b", "train.steps=50", "train.time_budget_s=1e-9",
                                                "eval.ks=[1]", "eval.before_rl=false", "data.synth_train_size=20"))
    run_dir = run_pipeline(cfg, echo=lines.append).run_dir
    assert any("time budget" in line and "after 0 RL steps" in line for line in lines)
    assert not (run_dir / "metrics.jsonl").exists() or read_jsonl(run_dir / "metrics.jsonl") == []
    assert "after_rl" in json.loads((run_dir / "eval.json").read_text())


def _nan_at(steps: set[int], monkeypatch):
    """Make the policy loss NaN at the given RL steps (1-based), through the loss's log-probs."""
    from rlft.trainers import update as upd

    original, calls = upd.batch_logprobs, {"step": 0}
    step_of = {}

    def poisoned(model, mb, cfg, **kwargs):
        logp, ent = original(model, mb, cfg, **kwargs)
        if kwargs.get("with_entropy") and step_of.get("now") in steps:
            logp = logp * float("nan")
        return logp, ent

    policy_step = upd._policy_step

    def counting(state, mb, cfg):
        step_of["now"] = state.step + 1
        return policy_step(state, mb, cfg)

    monkeypatch.setattr(upd, "batch_logprobs", poisoned)
    monkeypatch.setattr(upd, "_policy_step", counting)


def test_a_nan_loss_skips_that_update_and_is_counted(tmp_path, tiny_size_overrides, digit_reward, monkeypatch):
    """Step 2's loss is NaN: its update changes no weight, health/skipped_steps counts it, the run goes on."""
    import rlft.trainers.update as upd

    weights = []
    step = upd._optimizer_step

    def snapshot(model, *args, **kwargs):
        before = [p.detach().clone() for p in model.parameters()]
        out = step(model, *args, **kwargs)
        weights.append(all(torch.equal(a, b) for a, b in zip(before, model.parameters())))
        return out

    monkeypatch.setattr(upd, "_optimizer_step", snapshot)
    _nan_at({2}, monkeypatch)
    cfg = load_config(None, tiny_size_overrides(tmp_path, "log.name=nan", "eval.before_rl=false", *digit_reward))
    records = read_jsonl(run_pipeline(cfg, echo=quiet).run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[1]["nonfinite_keys"] and "actor/pg_loss" in records[1]["nonfinite_keys"]  # logged as they were
    assert len(weights) == 3 and weights[1] and not weights[2]  # the NaN step left every weight; step 3 trains
    assert [r["health/skipped_steps"] for r in records] == [0.0, 1.0, 1.0]
    assert [r["health/consecutive_skips"] for r in records] == [0.0, 1.0, 0.0]
    assert [r["actor/skipped_steps"] for r in records] == [0.0, 1.0, 0.0]


def test_nan_steps_in_a_row_stop_the_run_naming_the_last_checkpoint(run, monkeypatch):
    from rlft.errors import TrainingHalted

    _nan_at({3, 4, 5}, monkeypatch)
    with pytest.raises(TrainingHalted, match=r"RL steps 3-4: .*step_000002.*train.resume=true"):
        run("train.steps=6", "train.save_every=2", "train.max_consecutive_skips=2")
