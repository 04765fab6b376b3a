"""On-policy distillation (the distill stage): the reverse-KL advantage and loss by hand, against a naive loop, under
masks; a student equal to its teacher; the teachers' log-probs against a plain forward; the two signals' gradients;
a short run of the stage with teachers saved and loaded as a user's would be; the configuration's errors."""

from __future__ import annotations

import copy
import json
import math
import shutil

import pytest
import torch

from rlft.config import ConfigError
from rlft.core.distill import mixed_teacher_logp, reverse_kl, reverse_kl_advantage, reverse_kl_loss
from rlft.core.losses import aggregate
from rlft.models.tiny import build_tiny_model
from rlft.recipe import load_config
from rlft.trainers import update as upd
from rlft.trainers.distill import load_teachers
from rlft.trainers.rl import compute_advantages, fill_logprobs
from numerics import (FORWARD_DEPTH, MODEL_DEPTH, AbsGradSum, assert_rounding_close, model_reduction_len,
                      rounding_tol)
from test_rl_loop import (make_state, model, naive_logprobs, tok, varied_batch,  # noqa: F401  (fixtures)
                          with_advantages, T)

# ----------------------------------------------------------------------------- the maths


def test_advantage_and_loss_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    teacher = torch.tensor([[-1.5, -1.0, -3.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert torch.equal(reverse_kl(logp, teacher), torch.tensor([[0.5, -1.0, 2.5]]))
    # A_t = -coef * (log pi - log pi_T): a token the teacher likes less than the student is pushed down
    assert torch.equal(reverse_kl_advantage(logp, teacher, mask), torch.tensor([[-0.5, 1.0, 0.0]]))
    assert torch.equal(reverse_kl_advantage(logp, teacher, mask, coef=2.0), torch.tensor([[-1.0, 2.0, 0.0]]))
    assert not reverse_kl_advantage(logp, teacher, mask).requires_grad  # fixed at rollout time
    loss = reverse_kl_loss(logp, teacher)
    assert torch.equal(loss.detach(), torch.tensor([[0.5, -1.0, 2.5]]))  # the value: the k1 estimate d_t
    (loss * mask).sum().backward()
    assert torch.equal(logp.grad, torch.tensor([[0.5, -1.0, 0.0]]))  # the gradient: d_t * grad log pi(y_t)


def test_several_teachers_by_hand():
    teachers = torch.tensor([[[-1.0, -2.0]], [[-3.0, -4.0]]])  # (K=2, B=1, T=2)
    assert torch.equal(mixed_teacher_logp(teachers, (1.0, 3.0)), torch.tensor([[-2.5, -3.5]]))
    assert torch.equal(mixed_teacher_logp(teachers, (1.0, 1.0)), torch.tensor([[-2.0, -3.0]]))
    # the mixture's reverse KL is the weighted mean of the per-teacher ones
    logp = torch.tensor([[-0.5, -0.25]])
    per = [reverse_kl(logp, t) for t in teachers]
    assert torch.equal(reverse_kl(logp, mixed_teacher_logp(teachers, (0.25, 0.75))), 0.25 * per[0] + 0.75 * per[1])
    for bad in [(1.0,), (1.0, -1.0), (0.0, 0.0), (1.0, math.nan)]:
        with pytest.raises(ValueError):
            mixed_teacher_logp(teachers, bad)


def test_advantage_matches_a_naive_loop():
    g = torch.Generator().manual_seed(0)
    K, B, Tn = 3, 5, 7
    student = -torch.rand(B, Tn, generator=g, dtype=torch.float64) * 5
    teachers = -torch.rand(K, B, Tn, generator=g, dtype=torch.float64) * 5
    mask = (torch.rand(B, Tn, generator=g) > 0.3).long()
    weights, coef = (0.5, 2.0, 1.5), 0.7
    adv = reverse_kl_advantage(student, mixed_teacher_logp(teachers, weights), mask, coef)
    expected = torch.zeros(B, Tn, dtype=torch.float64)
    for b in range(B):
        for t in range(Tn):
            if mask[b, t]:
                mix = sum(w / sum(weights) * teachers[k, b, t].item() for k, w in enumerate(weights))
                expected[b, t] = -coef * (student[b, t].item() - mix)
    scale = coef * (student.abs() + teachers.abs().sum(0)).max().item()
    assert_rounding_close(adv, expected, n_terms=K + 2, scale=scale, dtype=torch.float64, what="advantage")


def test_masked_tokens_change_nothing():
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(4, 6, generator=g, dtype=torch.float64)
    teacher = -torch.rand(4, 6, generator=g, dtype=torch.float64)
    mask = (torch.rand(4, 6, generator=g) > 0.4).long()
    noise = torch.randn(4, 6, generator=g, dtype=torch.float64) * 100 * (1 - mask)
    assert torch.equal(reverse_kl_advantage(logp, teacher, mask), reverse_kl_advantage(logp + noise, teacher - noise,
                                                                                        mask))
    grads, values = [], []
    for shift in (torch.zeros_like(noise), noise):
        x = (logp + shift).requires_grad_(True)
        value = aggregate(reverse_kl_loss(x, teacher - shift), mask, "token-mean")
        value.backward()
        grads.append(x.grad * mask)
        values.append(value.item())
    assert values[0] == values[1] and torch.equal(grads[0], grads[1])


def test_a_student_equal_to_its_teacher_gets_no_signal():
    logp = torch.tensor([[-0.3, -2.0, -1.1]], requires_grad=True)
    mask = torch.ones(1, 3)
    assert torch.equal(reverse_kl_advantage(logp, logp.detach().clone(), mask), torch.zeros(1, 3))
    loss = reverse_kl_loss(logp, logp.detach().clone())
    loss.sum().backward()
    assert torch.equal(loss.detach(), torch.zeros(1, 3)) and torch.equal(logp.grad, torch.zeros(1, 3))


# ----------------------------------------------------------------------------- teachers in the RL loop


def distill_cfg(make, *extra):
    return make("algo.epochs=1", "algo.minibatches=1", "train.logprob_chunk=3", *extra)


@pytest.fixture
def make_cfg(tiny_overrides, tmp_path):
    def make(*extra: str):
        return load_config(None, tiny_overrides(tmp_path, f"rollout.max_new_tokens={T}", "optim.grad_clip=0",
                                                *extra))
    return make


@pytest.fixture
def teacher_dirs(tmp_path_factory):
    """Two teachers unlike the test model (another seed, another width), saved as any model directory."""
    root = tmp_path_factory.mktemp("teachers")
    return [build_tiny_model(root / "a", hidden_size=32, layers=1, heads=2, seed=1),
            build_tiny_model(root / "b", hidden_size=48, layers=2, heads=2, seed=2)]


def test_teacher_logprobs_equal_a_plain_forward(model, tok, make_cfg, teacher_dirs):  # noqa: F811
    """fill_logprobs' teachers' log-probs (chunked head, shared prefix, micro-batches) against an unpadded
    one-sequence forward, within the rounding bound; the mixture and each teacher's metric as defined."""
    cfg = distill_cfg(make_cfg, "distill.teachers=[a,b]", "distill.teacher_weights=[1,3]",
                      "train.micro_batch_size=3")
    teachers = load_teachers(load_config(None, [f"distill.teachers=[{teacher_dirs[0]},{teacher_dirs[1]}]"]), tok)
    state = make_state(model, tok)
    state.teachers = teachers
    batch = with_advantages(varied_batch(tok))
    metrics = fill_logprobs(state, batch, cfg)
    mask = batch.response_mask.bool()
    plain, bound = [], 0.0
    for teacher in teachers:
        rows = naive_logprobs(teacher, batch)
        full = torch.zeros(batch.response_ids.shape)
        for i, (lp, _, _) in enumerate(rows):
            full[i, :len(lp)] = lp
        plain.append(full)
        bound = max(bound, rounding_tol(model_reduction_len(teacher, batch), 1 + max(z for *_, z in rows),
                                        depth=FORWARD_DEPTH))
    expected = 0.25 * plain[0] + 0.75 * plain[1]
    assert (batch.teacher_logp[mask] - expected[mask]).abs().max().item() <= bound
    assert torch.equal(batch.teacher_logp[~mask], torch.zeros(int((~mask).sum())))
    assert batch.old_logp is not None  # single pass, but the signal needs the student's log-probs
    n = mask.sum().item()
    for k in range(2):
        want = ((batch.old_logp - plain[k])[mask]).sum().item() / n
        assert abs(metrics[f"distill/teacher_{k}/reverse_kl"] - want) <= bound + 1e-6 * abs(want)
    assert metrics["distill/reverse_kl"] == pytest.approx(
        0.25 * metrics["distill/teacher_0/reverse_kl"] + 0.75 * metrics["distill/teacher_1/reverse_kl"], abs=1e-5)


def test_a_student_equal_to_its_teacher_gets_zero_advantage(model, tok, make_cfg):  # noqa: F811
    cfg = distill_cfg(make_cfg, "distill.teachers=[t]")
    state = make_state(model, tok)
    state.teachers = [copy.deepcopy(model).eval().requires_grad_(False)]
    batch = with_advantages(varied_batch(tok))
    metrics = fill_logprobs(state, batch, cfg)
    metrics.update(compute_advantages(state, batch, cfg))
    mask = batch.response_mask.bool()
    bound = rounding_tol(model_reduction_len(model, batch), batch.old_logp.abs().max().item() + 1,
                         depth=FORWARD_DEPTH)
    assert batch.adv.abs().max().item() <= bound and abs(metrics["distill/reverse_kl"]) <= bound
    assert torch.equal(batch.adv[~mask], torch.zeros(int((~mask).sum())))


def test_task_reward_is_added_with_its_weight(model, tok, make_cfg, teacher_dirs):  # noqa: F811
    """adv = reward_weight * (the estimator's advantage) + the reverse-KL advantage; with signal loss, only the
    former."""
    teachers = load_teachers(load_config(None, [f"distill.teachers=[{teacher_dirs[0]}]"]), tok)
    advs = {}
    for extra in ([], ["distill.reward_weight=0.5"], ["distill.signal=loss", "distill.reward_weight=0.5"]):
        cfg = distill_cfg(make_cfg, "distill.teachers=[t]", *extra)
        state = make_state(model, tok)
        state.teachers = teachers
        batch = with_advantages(varied_batch(tok))
        fill_logprobs(state, batch, cfg)
        compute_advantages(state, batch, cfg)
        advs[tuple(extra)] = batch.adv
    state.teachers = []
    task = with_advantages(varied_batch(tok))
    compute_advantages(state, task, cfg)  # the estimator alone
    assert torch.allclose(advs[("distill.reward_weight=0.5",)], advs[()] + 0.5 * task.adv, atol=1e-6)
    assert torch.allclose(advs[("distill.signal=loss", "distill.reward_weight=0.5")], 0.5 * task.adv, atol=1e-6)


def test_the_two_signals_have_one_gradient_on_a_single_pass(model, tok, make_cfg, teacher_dirs):  # noqa: F811
    """One update pass with old == current weights: the clip loss's gradient of the reverse-KL advantage
    (-sum_t A_t grad ratio_t / N at ratio 1) equals the loss mode's (sum_t d_t grad log pi / N), within the bound of
    two backward passes of the same weights."""
    teachers = load_teachers(load_config(None, [f"distill.teachers=[{teacher_dirs[0]}]"]), tok)
    grads = []
    scales = []
    for signal in ("advantage", "loss"):
        cfg = distill_cfg(make_cfg, "distill.teachers=[t]", f"distill.signal={signal}", "algo.loss_agg=token-mean")
        policy = copy.deepcopy(model)
        state = make_state(policy, tok, lr=0.0)
        state.teachers = teachers
        batch = with_advantages(varied_batch(tok))
        fill_logprobs(state, batch, cfg)
        compute_advantages(state, batch, cfg)
        sums = AbsGradSum(policy)
        metrics = upd.update(state, batch, cfg)
        assert math.isfinite(metrics["actor/grad_norm"])
        grads.append(state.optimizer.grads[-1])
        scales.append(sums)
    n = model_reduction_len(model, varied_batch(tok))
    for name in grads[0]:
        scale = max(scales[0].scale(name), scales[1].scale(name))
        assert_rounding_close(grads[0][name], grads[1][name], n_terms=n, scale=scale, depth=MODEL_DEPTH, what=name)
    assert any(g.abs().max() > 0 for g in grads[0].values())


# ----------------------------------------------------------------------------- the stage


def run_distill(tmp_path, tiny_overrides, teachers, *extra):
    from rlft.stages.pipeline import run_pipeline

    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=d", "stages=[distill]", "train.steps=2",
                                           f"distill.teachers=[{','.join(str(t) for t in teachers)}]", *extra))
    return run_pipeline(cfg, echo=lambda *a: None)


@pytest.mark.parametrize("extra", [
    [],
    ["distill.signal=loss", "distill.reward_weight=0.5", "distill.teacher_weights=[1,2]", "algo.epochs=2"],
])
def test_the_stage_runs_with_finite_metrics(tmp_path, tiny_overrides, teacher_dirs, extra):
    teachers = teacher_dirs if "distill.teacher_weights=[1,2]" in extra else teacher_dirs[:1]
    result = run_distill(tmp_path, tiny_overrides, teachers, *extra)
    assert [e["stage"] for e in result.stages] == ["distill"]
    assert result.stages[0]["summary"].startswith("distill (")
    rows = [json.loads(line) for line in (tmp_path / "d" / "0-distill" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    keys = ["distill/reverse_kl", "distill/teacher_logp", "actor/grad_norm", "reward/mean",
            *(f"distill/teacher_{k}/reverse_kl" for k in range(len(teachers)))]
    keys += ["distill/kl_loss"] if "distill.signal=loss" in extra else ["distill/kl_adv_abs"]
    for row in rows:
        for key in keys:
            assert math.isfinite(row[key]), (key, row)
    assert (tmp_path / "d" / "0-distill" / "policy" / "config.json").is_file()


def test_a_teacher_with_another_tokenizer_is_refused(tmp_path, tok, teacher_dirs):  # noqa: F811
    other = tmp_path / "other"
    shutil.copytree(teacher_dirs[0], other)
    from rlft.models.tiny import build_tokenizer

    changed = build_tokenizer()
    changed.add_tokens(["<tool>"])
    changed.save_pretrained(other)
    cfg = load_config(None, [f"distill.teachers=[{teacher_dirs[0]},{other}]"])
    with pytest.raises(ConfigError, match=r"distill\.teachers\[1\]: .*tokenizer differs.*<tool>"):
        load_teachers(cfg, tok)


def test_a_missing_teacher_fails_before_anything_is_written(tmp_path, tiny_overrides):
    with pytest.raises(ConfigError, match=r"distill\.teachers\[0\]: .*no such directory"):
        run_distill(tmp_path, tiny_overrides, [tmp_path / "nowhere" / "teacher"])
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("overrides, key", [
    (["stages=[distill]"], "distill.teachers"),
    (["distill.teachers=[a,b]", "distill.teacher_weights=[1]"], "distill.teacher_weights"),
    (["distill.teachers=[a]", "distill.teacher_weights=[-1]"], r"distill.teacher_weights\[0\]"),
    (["distill.teachers=[a,b]", "distill.teacher_weights=[0,0]"], "distill.teacher_weights"),
    (["distill.kl_coef=0"], "distill.kl_coef"),
    (["distill.reward_weight=-1"], "distill.reward_weight"),
    (["distill.signal=forward"], "distill.signal"),
])
def test_config_errors_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=f"^{key}"):
        load_config(None, overrides)


def test_the_recipe_parses(recipes_dir):
    cfg = load_config(recipes_dir / "distill_demo.yaml")
    assert cfg.stages == ("sft", "distill") and cfg.distill.teachers and cfg.distill.signal == "advantage"


def test_rlft_distill_runs_one_stage(tmp_path, tiny_overrides, tiny_model_dir, teacher_dirs, capsys):
    """`rlft distill`: the stage alone on model.path, flat in its run directory; no teacher: exit 2, the key named."""
    from rlft.cli.main import main

    overrides = tiny_overrides(tmp_path, "log.name=cli", f"model.path={tiny_model_dir}", "train.steps=1")
    assert main(["distill", *overrides, f"distill.teachers=[{teacher_dirs[0]}]"]) == 0
    assert "distill (advantage, 1 teacher)" in capsys.readouterr().out
    assert (tmp_path / "cli" / "policy" / "config.json").is_file()
    assert "distill/reverse_kl" in json.loads((tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()[0])
    assert main(["distill", *tiny_overrides(tmp_path, "log.name=none")]) == 2
    assert "distill.teachers" in capsys.readouterr().err and not (tmp_path / "none").exists()
