"""Several agents on one base (issue 32): roles that take turns in an episode, each its own LoRA adapter, its own
reward and advantage, one optimizer step for all (rlft.config.roles, rlft.trainers.roles, rlft.models.roles.by_role,
the ``review`` environment and recipes/multiagent_demo.yaml)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, strategies as st

pytest.importorskip("peft")

from rlft.config import ConfigError  # noqa: E402
from rlft.config.sections import Config  # noqa: E402
from rlft.core.advantages import ADVANTAGES, AdvantageInputs  # noqa: E402
from rlft.data.synthetic import synthetic_task  # noqa: E402
from rlft.envs import ENVS, EpisodeOver, Step  # noqa: E402
from rlft.envs.review import AGAIN, ASK  # noqa: E402
from rlft.models.forward import response_logprobs  # noqa: E402
from rlft.models.loading import load_policy  # noqa: E402
from rlft.models.roles import acting, adapter_parameters, has_roles, roles_of  # noqa: E402
from rlft.recipe import load_config  # noqa: E402
from rlft.rollout.batch import Batch, cat_batches  # noqa: E402
from rlft.rollout.multiturn import multiturn_rollout, role_text  # noqa: E402
from rlft.stages.pipeline import run_pipeline  # noqa: E402
from rlft.trainers.roles import role_advantages, role_metrics, score_roles  # noqa: E402
from rlft.trainers.update import batch_logprobs  # noqa: E402
from numerics import FORWARD_DEPTH, assert_rounding_close  # noqa: E402
from test_envs import FUZZ, hostile  # noqa: E402
from test_multiturn import Scripted, limits  # noqa: E402
from test_rl_loop import tok  # noqa: E402,F401  (fixture)
from test_roles import ROLES, two_roles  # noqa: E402

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "multiagent_demo.yaml"


# --------------------------------------------------------------------------- the review environment, by hand


def play(turns: list[str], truth: str = "7", **params) -> list[Step]:
    env = ENVS.get("review")(**params)
    assert env.reset({"ground_truth": truth}) is None
    return [env.step(t) for t in turns]


def test_a_right_answer_judged_right_pays_both_roles():
    ask, end = play(["#### 7", "yes"])
    assert (ask.observation, ask.done, ask.reward) == (ASK, False, None)
    assert end.done and end.observation is None and end.reward is None
    assert end.info["role_rewards"] == {"verifier": 1.0, "solver": 1.0}


@pytest.mark.parametrize("answer, verdict, verifier", [
    ("#### 5", "yes", 0.0),     # a wrong answer passed
    ("#### 7", "no", 0.0),  # a right answer refused (then the solver answers again)
    ("#### 5", "maybe", 0.0),   # no verdict: wrong
    ("no number", "no", 1.0),   # no answer is a wrong answer: refusing it is right
])
def test_the_verifier_is_paid_for_being_right_about_the_answer(answer, verdict, verifier):
    steps = play([answer, verdict], retries=0)
    assert steps[-1].done and steps[-1].info["role_rewards"]["verifier"] == verifier


def test_after_a_no_the_solver_answers_again_and_its_last_answer_stands():
    ask, again, end = play(["#### 5", "no", "#### 7"])
    assert again.observation == AGAIN and not again.done and again.info["role_rewards"] == {"verifier": 1.0}
    assert end.done and end.info["role_rewards"] == {"solver": 1.0}  # the second answer is not judged
    *_, end = play(["#### 7", "no", "#### 8"])
    assert end.info["role_rewards"] == {"solver": 0.0}
    *_, end = play(["#### 5", "no", "#### 5", "no"], retries=2)
    assert not end.done and end.observation == AGAIN  # two retries: judged again


def test_the_review_environment_refuses_what_the_caller_does_wrong():
    env = ENVS.get("review")()
    with pytest.raises(ValueError, match="not an integer"):
        env.reset({"ground_truth": "seven"})
    env.reset({"ground_truth": "-3"})
    env.step("#### -3")
    env.step("yes")
    with pytest.raises(EpisodeOver):
        env.step("#### 1")
    for params, match in (({"retries": -1}, "retries"), ({"solver": "a", "verifier": "a"}, "verifier"),
                          ({"solver": ""}, "solver")):
        with pytest.raises(ValueError, match=match):
            ENVS.get("review")(**params)


def test_the_review_warm_up_shows_both_roles_on_the_max_problems():
    demos, _ = synthetic_task("review", n_train=200, n_eval=0, seed=5)
    problems, _ = synthetic_task("max", n_train=200, n_eval=50, seed=5)
    assert [d.prompt[0] for d in demos] == [p.prompt[0] for p in problems]  # the same problems, same order
    verify = [d for d in demos if len(d.prompt) == 3]
    assert 60 < len(verify) < 140 and {d.response for d in verify} == {"yes", "no"}
    for d in verify:
        shown = int(d.prompt[1]["content"].removeprefix("#### "))
        numbers = [int(x) for x in d.prompt[0]["content"][4:].split(")")[0].split(",")]
        assert d.prompt[2] == {"role": "user", "content": ASK}
        assert (d.response == "yes") == (shown == int(d.ground_truth) == max(numbers))
        assert d.response == "yes" or shown in numbers or 1 <= abs(shown - int(d.ground_truth)) <= 9
    solve = [d for d in demos if len(d.prompt) == 1]
    assert all(d.response == f"#### {d.ground_truth}" for d in solve)


# --------------------------------------------------------------------------- episodes that alternate roles


def run_roles(tok, solver: list[list[str]], verifier: list[list[str]], *, make=None, truth="7"):
    samplers = {"solver": Scripted(tok, solver), "verifier": Scripted(tok, verifier)}
    prompts = [tok("Q: go\nA: ", add_special_tokens=False)["input_ids"]] * len(solver)
    batch, trajs = multiturn_rollout(
        tok, prompts, [{"ground_truth": truth}] * len(prompts), [({"role": "user", "content": "go"},)] * len(prompts),
        make_env=make or (lambda sample: ENVS.get("review")()), limits=limits(role="user"), group_size=1,
        sample_turn=samplers, stops=[tok.eos_token_id], chat=False, roles=ROLES)
    return batch, trajs, samplers


def test_roles_take_turns_and_every_token_names_the_role_that_wrote_it(tok):
    batch, trajs, samplers = run_roles(tok, [["#### 7$"], ["#### 5$", "#### 7$"]], [["yes$"], ["no$"]])
    assert [t.turns for t in trajs] == [2, 3] and all(t.error is None for t in trajs)
    assert batch.texts == ["#### 7", "#### 7"]  # the first role's last turn
    for row, tr in enumerate(trajs):
        who = [s.get("role", "env") for s in tr.segments]
        assert who == (["solver", "env", "verifier"] if row == 0 else
                       ["solver", "env", "verifier", "env", "solver"])
        roles = batch.roles[row][batch.response_mask[row].bool()].tolist()
        env = batch.env_mask[row][batch.response_mask[row].bool()].tolist()
        assert [r == -1 for r in roles] == [bool(e) for e in env]  # -1 exactly on the environment's tokens
        for k, name in enumerate(ROLES):  # each role's tokens are the ids its own sampler gave out, in order
            mine = batch.response_ids[row][batch.role_mask(k)[row].bool()].tolist()
            assert mine == [i for turn in samplers[name].given[row] for i in turn]
    assert trajs[0].role_rewards == {"solver": 1.0, "verifier": 1.0}
    assert trajs[1].role_rewards == {"solver": 1.0, "verifier": 1.0}
    # the verifier saw the solver's answer and the question it is asked, as context
    context = tok.decode(samplers["verifier"].calls[0][0][0])
    assert context.endswith("#### 7" + tok.eos_token + ASK) or context.endswith("#### 7" + ASK)
    # each sampler was called only for the rows whose turn it was: row 1's retry alone in the solver's third call
    assert [len(c[0]) for c in samplers["solver"].calls] == [2, 1]
    assert [len(c[0]) for c in samplers["verifier"].calls] == [2]


class Named:
    """An environment that hands the turn to whoever ``order`` says and pays ``pay`` to the roles."""

    def __init__(self, order, pay=None):
        self.order, self.pay, self.k = order, pay, 0

    def reset(self, sample):
        return None

    def step(self, text):
        nxt = self.order[self.k] if self.k < len(self.order) else None
        self.k += 1
        info = {"next_role": nxt} if nxt is not None else {}
        if self.pay is not None:
            info["role_rewards"] = self.pay
        return Step("ok", None, nxt is None, info)


def test_the_environment_may_name_the_next_role(tok):
    batch, trajs, _ = run_roles(tok, [["a$", "b$", "c$"]], [[]], make=lambda s: Named(["solver", "solver"]))
    assert [s.get("role") for s in trajs[0].segments if s["who"] == "policy"] == ["solver"] * 3
    assert not (batch.roles[0] == 1).any()


@pytest.mark.parametrize("env, match", [
    (lambda s: Named(["critic"]), "next_role 'critic'"),
    (lambda s: Named([], pay={"critic": 1.0}), "role_rewards names 'critic'"),
    (lambda s: Named([], pay={"solver": math.nan}), "not a finite number"),
    (lambda s: Named([], pay={"solver": True}), "not a finite number"),
    (lambda s: Named([], pay=[1.0]), "must map roles"),
])
def test_a_bad_role_from_the_environment_costs_that_trajectory(tok, env, match):
    _, trajs, _ = run_roles(tok, [["a$", "b$"]], [["c$"]], make=env)
    assert trajs[0].error is not None and match.split("'")[0] in trajs[0].error


def test_role_text_is_the_last_turn_of_the_role():
    segs = [{"who": "policy", "role": "solver", "text": "1"}, {"who": "env", "text": "?"},
            {"who": "policy", "role": "verifier", "text": "no"}]
    assert role_text(segs, "solver") == "1" and role_text(segs, "verifier") == "no" and role_text(segs, "x") == ""


# --------------------------------------------------------------------------- rewards and advantages per role


def roles_batch(scores: list[list[float]], roles: list[list[int]], group_size: int = 2) -> Batch:
    B, T = len(roles), len(roles[0])
    role_t = torch.tensor(roles)
    mask = torch.ones(B, T, dtype=torch.long)
    return Batch(prompt_ids=torch.ones(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.long),
                 response_ids=torch.ones(B, T, dtype=torch.long), response_mask=mask,
                 truncated=torch.zeros(B, dtype=torch.bool), group_size=group_size,
                 env_mask=(role_t == -1).long(), roles=role_t, role_scores=torch.tensor(scores))


def advantages(batch: Batch, name: str = "group_norm"):
    cfg = Config().algo
    inp = AdvantageInputs(batch.role_scores[:, 0], batch.action_mask, batch.group_size)
    return role_advantages(lambda x: ADVANTAGES.get(name)(x, cfg), inp, batch)


def test_each_role_gets_its_own_group_advantage_by_hand():
    # rows 0, 1: one group. Solver (role 0) scores 1, 0; verifier (role 1) scores 0, 1 (unbiased std: +-0.7071)
    batch = roles_batch([[1.0, 0.0], [0.0, 1.0]], [[0, 0, -1, 1], [0, -1, 1, 1]])
    adv, _ = advantages(batch)
    h = 1 / math.sqrt(2)
    expected = torch.tensor([[h, h, 0.0, -h], [-h, 0.0, h, h]])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_role_advantages_equal_a_naive_loop_over_roles_and_tokens():
    g = torch.Generator().manual_seed(0)
    roles = torch.randint(-1, 3, (8, 6), generator=g)
    scores = torch.rand(8, 3, generator=g)
    scores[3, 1] = math.nan  # one unscorable role of one episode
    batch = roles_batch(scores.tolist(), roles.tolist(), group_size=4)
    for name in ("group_norm", "rloo", "group_mean"):
        adv, _ = advantages(batch, name)
        cfg = Config().algo
        for k in range(3):
            alone = ADVANTAGES.get(name)(AdvantageInputs(scores[:, k], batch.role_mask(k), 4), cfg)[0]
            for b in range(8):
                for t in range(6):
                    if roles[b, t] == k:
                        assert adv[b, t].item() == pytest.approx(alone[b, t].item(), abs=1e-6, nan_ok=True)
        assert (adv[roles == -1] == 0).all()


def test_one_roles_rewards_change_no_other_roles_advantage():
    batch = roles_batch([[1.0, 0.0], [0.0, 1.0], [0.5, 0.2], [0.1, 0.9]], [[0, 1], [0, 1], [1, 0], [0, 1]])
    before, _ = advantages(batch)
    batch.role_scores[:, 1] = torch.tensor([9.0, -3.0, 4.0, 0.0])
    after, _ = advantages(batch)
    solver = batch.roles == 0
    assert torch.equal(before[solver], after[solver]) and not torch.equal(before[~solver], after[~solver])


def episodes(rewards, errors=None):
    return [{"role_rewards": r, "error": e, "segments": [{"who": "policy", "role": "solver", "text": "#### 7"},
                                                         {"who": "policy", "role": "verifier", "text": "yes"}]}
            for r, e in zip(rewards, errors or [None] * len(rewards))]


def test_score_roles_reads_the_task_reward_or_the_environments_verdict():
    cfg = load_config(RECIPE)
    assert cfg.roles.sources == ("task", "env")
    batch = roles_batch([[0, 0]] * 3, [[0, 1]] * 3, group_size=1)
    batch.episodes = episodes([{"verifier": 1.0}, {}, {"verifier": 0.0}], [None, None, "RuntimeError: x"])
    scores = score_roles(batch, torch.tensor([1.0, 0.0, 1.0]), [{"ground_truth": "7"}] * 3, cfg)
    assert scores.shape == (3, 2)
    assert scores[0].tolist() == [1.0, 1.0]
    assert scores[1, 0] == 0.0 and math.isnan(scores[1, 1])  # no verdict given: unscored, never 0
    assert torch.isnan(scores[2]).all()  # the environment cost the trajectory: every role unscored
    assert batch.episodes[0]["role_scores"] == {"solver": 1.0, "verifier": 1.0}
    # task for the second role: the run's reward functions on its last turn
    both = load_config(RECIPE, ["roles.rewards=[task, task]"])
    scores = score_roles(batch, torch.tensor([1.0, 0.0, 1.0]), [{"ground_truth": "7"}] * 3, both)
    assert scores[:2, 1].tolist() == [0.0, 0.0]  # "yes" is not a right final answer


def test_role_metrics_by_hand():
    batch = roles_batch([[1.0, math.nan], [0.0, 1.0]], [[0, 0, -1, 1], [0, -1, 1, 1]])
    batch.episodes = [{"segments": [{"who": "policy", "role": "solver"}, {"who": "env"}]},
                      {"segments": [{"who": "policy", "role": "solver"}, {"who": "policy", "role": "verifier"}]}]
    m = role_metrics([batch], ROLES)
    assert m["role/solver/reward/mean"] == 0.5 and m["role/verifier/reward/mean"] == 1.0
    assert m["role/solver/tokens/mean"] == 1.5 and m["role/verifier/tokens/mean"] == 1.5
    assert m["role/solver/turns/mean"] == 1.0 and m["role/verifier/turns/mean"] == 0.5
    assert role_metrics([roles_batch([[1.0]], [[0]], 1)][:0], ROLES) == {}


def test_concatenated_batches_pad_roles_with_no_role():
    a = roles_batch([[1.0, 0.0]], [[0, 1, 1]], 1)
    b = roles_batch([[0.0, 1.0]], [[1]], 1)
    both = cat_batches([a, b])
    assert both.roles.tolist() == [[0, 1, 1], [1, -1, -1]] and both.role_scores.shape == (2, 2)
    assert both.trimmed().role_scores.shape == (2, 2) and both.index(torch.tensor([1])).role_scores.tolist() == [[0, 1]]


# --------------------------------------------------------------------------- the forward under each role


def forward_batch(tok, roles: list[list[int]]) -> Batch:
    B, T = len(roles), len(roles[0])
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(4, len(tok), (B, 5), generator=g)
    response = torch.randint(4, len(tok), (B, T), generator=g)
    role_t = torch.tensor(roles)
    return Batch(prompt_ids=prompt, prompt_mask=torch.ones_like(prompt), response_ids=response,
                 response_mask=torch.ones_like(response), truncated=torch.zeros(B, dtype=torch.bool), group_size=1,
                 env_mask=(role_t == -1).long(), roles=role_t)


def test_each_token_gets_its_roles_logprob_as_a_naive_loop_would(tiny_model_dir, tok):
    model = two_roles(tiny_model_dir)
    batch = forward_batch(tok, [[0, 0, -1, 1, 1, 0], [1, 1, 1, -1, -1, -1], [0, -1, 0, 0, 0, 0]])
    cfg = Config()
    logp, ent = batch_logprobs(model, batch, cfg, with_entropy=True)
    for k, name in enumerate(ROLES):
        with acting(model, name):
            alone, alone_ent = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                                 batch.response_mask, with_entropy=True, shared_prefix=False)
        mine = batch.roles == k
        n = model.config.vocab_size
        assert_rounding_close(logp[mine], alone[mine], n_terms=n, scale=1 + alone.abs().max().item(),
                              depth=FORWARD_DEPTH)
        assert_rounding_close(ent[mine], alone_ent[mine], n_terms=n, scale=1 + alone_ent.abs().max().item(),
                              depth=FORWARD_DEPTH)
    assert (logp[batch.roles == -1] == 0).all()  # no role wrote these: nothing (they are masked everywhere)
    assert roles_of(model).names == ROLES and model.active_adapter == "solver"  # the active role given back


def test_a_loss_on_one_roles_tokens_reaches_only_that_roles_adapter(tiny_model_dir, tok):
    model = two_roles(tiny_model_dir)
    batch = forward_batch(tok, [[0, 0, 1, 1], [1, -1, 0, 0]])
    logp, _ = batch_logprobs(model, batch, Config())
    logp[batch.roles == 1].sum().backward()
    solver, verifier = adapter_parameters(model, "solver"), adapter_parameters(model, "verifier")
    assert all(p.grad is None or not p.grad.any() for p in solver)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in verifier)
    base = [p for n, p in model.named_parameters() if "lora_" not in n]
    assert all(p.grad is None for p in base)


def test_a_batch_no_role_wrote_gives_zeros_that_still_carry_a_graph(tiny_model_dir, tok):
    """Every token the environment's (-1): no role's pass has rows, so one pass of the first role runs and every
    output is its zero multiple: the right shape, exactly 0, and a backward through it reaches no weight's value
    (the adapters' gradients are 0), as a micro-batch of a lockstep run with nothing of its own needs."""
    model = two_roles(tiny_model_dir)
    batch = forward_batch(tok, [[-1, -1, -1], [-1, -1, -1]])
    logp, ent = batch_logprobs(model, batch, Config(), with_entropy=True)
    assert logp.shape == ent.shape == batch.response_ids.shape
    assert (logp == 0).all() and (ent == 0).all()
    assert logp.requires_grad
    (logp.sum() + ent.sum()).backward()
    grads = [p.grad for role in ROLES for p in adapter_parameters(model, role)]
    assert all(g is None or not g.any() for g in grads) and any(g is not None for g in grads)
    assert model.active_adapter == "solver"


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize("overrides, key", [
    (["env=null"], "roles"),
    (["lora.rank=0"], "roles"),
    (["lora.save=merged"], "lora.save"),
    (["roles.names=[solver]"], "roles.names"),
    (["roles.names=[solver, solver]"], "roles.names"),
    (["roles.frozen=[critic]"], "roles.frozen"),
    (["roles.frozen=[solver, verifier]"], "roles.frozen"),
    (["roles.rewards=[task]"], "roles.rewards"),
    (["roles.rewards=[task, judge]"], "roles.rewards"),
    (["algo.preset=reinforce", "algo.baseline=ema"], "algo.baseline"),
    (["sft.source=synthetic:nope"], "sft.source"),
])
def test_what_roles_need_is_checked_at_parse_time(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(RECIPE, overrides)


def test_the_recipe_loads_as_documented(tmp_path):
    cfg = load_config(RECIPE)
    assert cfg.roles.names == ("solver", "verifier") and cfg.roles.frozen == ()
    assert cfg.env.name == "review" and cfg.env.role == "user" and cfg.env.kwargs == {"retries": 0}
    assert cfg.env.max_turns == 2  # solve, review
    assert cfg.sft.source == "synthetic:review" and cfg.data.source == "synthetic:max"
    assert cfg.lora.rank > 0 and cfg.reward.keys == ("final_answer",)
    (tmp_path / "config.yaml").write_text(cfg.to_yaml())  # the saved config of a run loads back the same
    assert load_config(tmp_path / "config.yaml").roles == cfg.roles


# --------------------------------------------------------------------------- the recipe, tiny


def test_a_tiny_run_trains_both_roles_and_saves_them_loadable(tmp_path, tiny_size_overrides):
    cfg = load_config(RECIPE, tiny_size_overrides(
        tmp_path / "runs", "sft.steps=30", "train.steps=2", "data.num_eval=6", "data.synth_train_size=60",
        "eval.ks=[1]", "reward.workers=1", "log.name=ma", "train.save_every=1", "roles.frozen=[verifier]",
        "algo.entropy_coef=0.01", "log.samples_every=1"))  # a gradient at every step, whatever the rewards
    result = run_pipeline(cfg, echo=lambda *a, **k: None)
    records = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for rec in records:
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in rec.values())
        assert {f"role/{r}/{m}" for r in ROLES for m in ("reward/mean", "turns/mean", "tokens/mean")} <= set(rec)
        assert rec["role/solver/turns/mean"] >= 1.0 and rec["env/errors"] == 0.0
    policy = result.run_dir / "policy"
    assert json.loads((policy / "roles.json").read_text()) == {"roles": list(ROLES), "frozen": ["verifier"]}
    model, _ = load_policy(str(policy), cfg.model)
    assert has_roles(model) and roles_of(model).names == ROLES
    # the frozen verifier's adapter never trained: LoRA's B is still zero; the solver's moved
    moved = {r: any(p.abs().sum() > 0 for n, p in model.named_parameters() if f"lora_B.{r}." in n) for r in ROLES}
    assert moved == {"solver": True, "verifier": False}
    base = Path(json.loads((policy / "solver" / "adapter_config.json").read_text())["base_model_name_or_path"])
    assert base == (result.run_dir / "roles_base").resolve()  # the warmed-up base the adapters apply to
    ckpts = sorted((result.run_dir / "checkpoints").glob("step_*"))
    assert ckpts and (ckpts[-1] / "policy" / "roles.json").is_file()
    for when in ("before_rl", "after_rl"):
        assert result.eval[when]["n"] == 6 and 1.0 <= result.eval[when]["turns"] <= 3
        verdicts = {k: v for k, v in result.eval[when].items() if k.startswith("role/")}  # the environment's
        assert set(verdicts) <= {f"role/{r}/reward" for r in ROLES}  # verdicts on the greedy episodes, if any
        assert all(0.0 <= v <= 1.0 for v in verdicts.values())
    samples = [json.loads(x) for x in (result.run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(set(s["episode"]["role_scores"]) == set(ROLES) for s in samples)
    assert all(s["completion"] == role_text(s["episode"]["segments"], "solver") for s in samples)
    page = (result.run_dir / "report.html").read_text()  # each turn shown with the role that wrote it
    assert '<span class="who">solver</span>' in page and '<span class="who">verifier</span>' in page


def test_a_run_with_roles_resumes_from_its_checkpoint_with_every_roles_adapter(tmp_path, tiny_size_overrides,
                                                                             monkeypatch):
    from rlft.models.loading import load_model
    from rlft.models.roles import base_dir, load_roles
    from rlft.trainers import rl_loop

    common = ["sft.steps=20", "data.num_eval=4", "data.synth_train_size=40", "eval.ks=[1]", "reward.workers=1",
              "log.name=ma", "train.save_every=1", "algo.entropy_coef=0.01", "eval.before_rl=false"]
    run_dir = run_pipeline(load_config(RECIPE, tiny_size_overrides(tmp_path / "runs", *common, "train.steps=2")),
                           echo=lambda *a, **k: None).run_dir
    ckpt = run_dir / "checkpoints" / "step_000001"  # the last step is the final policy, not a checkpoint
    saved = load_roles(load_model(base_dir(ckpt / "policy")), ckpt / "policy")
    restored = {}

    def recording_restore(state, ckpt, run_dir, echo, cfg):
        rl_loop_restore(state, ckpt, run_dir, echo, cfg)
        restored.update({r: [p.detach().clone() for p in adapter_parameters(state.policy, r)] for r in ROLES})
        restored["optimizer"] = sum(len(g["params"]) for g in state.optimizer.param_groups)

    rl_loop_restore = rl_loop.restore
    monkeypatch.setattr(rl_loop, "restore", recording_restore)
    lines: list[str] = []
    run_pipeline(load_config(RECIPE, tiny_size_overrides(tmp_path / "runs", *common, "train.steps=3",
                                                         "train.resume=true")), echo=lines.append)
    assert any("resumed" in line and "step_000001" in line for line in lines)
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    for role in ROLES:  # both adapters as the checkpoint holds them, tensor for tensor
        assert all(torch.equal(a, b) for a, b in zip(restored[role], adapter_parameters(saved, role))), role
    assert restored["optimizer"] == sum(len(adapter_parameters(saved, r)) for r in ROLES)


def test_the_held_out_evaluation_reports_each_roles_verdicts_by_hand():
    from rlft.insight.eval import _role_verdicts

    episodes = [{"role_rewards": {"solver": 1.0, "verifier": 1.0}}, {"role_rewards": {"verifier": 0.0}},
                {"role_rewards": {}}, {}]
    assert _role_verdicts(episodes) == {"role/solver/reward": 1.0, "role/verifier/reward": 0.5}
    assert _role_verdicts([{"role_rewards": {}}]) == {}


@FUZZ
@given(st.lists(hostile, min_size=1, max_size=10), st.integers(0, 3), st.integers(-10**6, 10**6))
def test_the_review_environment_answers_any_text_inside_a_step(actions, retries, truth):
    env = ENVS.get("review")(retries=retries)
    assert env.reset({"ground_truth": truth}) is None
    judged = 0
    for n, action in enumerate(actions, 1):
        step = env.step(action)
        assert step.reward is None and step.observation in (None, ASK, AGAIN)
        for role, value in step.info.get("role_rewards", {}).items():
            assert role in ROLES and value in (0.0, 1.0)
        judged += step.observation == AGAIN
        if step.done:
            assert "solver" in step.info["role_rewards"]
            break
    assert n <= 2 * retries + 2 and judged <= retries


def test_roles_after_a_pipelines_sft_stage_record_its_model(tmp_path, tiny_size_overrides):
    """stages [sft, rl]: the rl stage's roles go on the sft stage's model, and their adapters name the directory
    that model was loaded from (not the pipeline's first model), so the final policy loads back with it."""
    cfg = load_config(RECIPE, tiny_size_overrides(
        tmp_path / "runs", "stages=[sft, rl]", "sft.steps=10", "train.steps=1", "data.num_eval=4",
        "data.synth_train_size=40", "eval.ks=[1]", "reward.workers=1", "log.name=p", "eval.before_rl=false"))
    result = run_pipeline(cfg, echo=lambda *a, **k: None)
    policy = Path(result.stages[-1]["model_dir"])
    recorded = Path(json.loads((policy / "verifier" / "adapter_config.json").read_text())["base_model_name_or_path"])
    assert recorded == Path(result.stages[0]["model_dir"]).resolve() and (recorded / "config.json").is_file()
    model, _ = load_policy(str(policy), cfg.model)
    assert roles_of(model).names == ROLES
