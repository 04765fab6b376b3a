"""Sampling-support replay end to end: the samplers record each draw's kept set under top-p / top-k / min-p, and the
trainer's log-probs over those sets are the sampler's (``rollout.replay_support``, ``rlft.core.support``).

* under both of rlft's samplers (its own decoder and transformers' ``generate``), single-turn and multi-turn, at
  top_p = 0.8 on the tiny model: every sampled token lies in its kept set, and the trainer's log-probs of the same
  tokens equal the sampler's within a rounding bound with the replay, while without it the ratio is the kept
  mass, measurably below 1;
* the gradient of the trainer's log-probs with the replay equals a naive per-token loop over the kept set, on the
  chunked path and on the full-logits path;
* without truncation (top_p = 1, top_k = 0, min_p = 0) the replay changes nothing, bit for bit, in a run;
* a run at top_p = 0.8: ``rollout_corr/logp_gap_mean`` is rounding with the replay and |log S| without.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from rlft.core.support import PAD
from rlft.models.forward import response_logprobs
from rlft.models.tokens import eos_ids
from rlft.rollout.batch import cat_batches
from rlft.rollout.hf import generate, turn_sampler
from rlft.rollout.trajectory import Trajectory, trajectories_batch
from numerics import (AbsGradSum, FORWARD_DEPTH, MODEL_DEPTH, assert_rounding_close, model_reduction_len,
                      rounding_tol)
from test_rl_loop import model, naive_logprobs, tok  # noqa: F401  (fixtures)

PROMPTS = ["1+1=", "what is 12*3? ", "hi there", "7-2="]


def sampled(model, tok, sampler: str, replay: bool = True, seed: int = 0, **warps):
    torch.manual_seed(seed)
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    return generate(model, tok, ids, group_size=3, max_new_tokens=10, sampler=sampler, replay=replay,
                    **{"top_p": 0.8, **warps})


def assert_scores_what_was_drawn(model, batch, replayed, mask, what: str) -> float:
    """The trainer's replayed log-probs equal the sampler's within the rounding bound of one forward; returns it."""
    scale = 1 + max(z for _, _, z in naive_logprobs(model, batch))
    assert_rounding_close(replayed[mask], batch.rollout_logp[mask], n_terms=model_reduction_len(model, batch),
                          scale=scale, depth=FORWARD_DEPTH, what=what)
    return rounding_tol(model_reduction_len(model, batch), scale, depth=FORWARD_DEPTH)


def trainer_logp(model, batch, kept, chunk=1024):
    return response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask,
                             chunk=chunk, kept=kept)[0]


@pytest.mark.parametrize("sampler", ["rlft", "generate"])
def test_with_the_replay_the_trainer_scores_what_the_sampler_drew(model, tok, sampler):
    batch = sampled(model, tok, sampler)
    mask = batch.response_mask.bool()
    kept = batch.rollout_kept
    assert kept is not None and kept.shape[:2] == batch.response_ids.shape
    inside = (kept == batch.response_ids[..., None]).any(-1)
    assert inside[mask].all() and (kept[~mask] == PAD).all()  # each token in its set; nothing after the stop
    assert (kept[mask] != PAD).sum(-1).min() >= 1
    with torch.no_grad():
        replayed = trainer_logp(model, batch, kept)
        full = trainer_logp(model, batch, None)
    tol = assert_scores_what_was_drawn(model, batch, replayed, mask, "trainer vs sampler, replayed")
    ratio_replay = (replayed - batch.rollout_logp)[mask].exp().mean().item()
    ratio_full = (full - batch.rollout_logp)[mask].exp().mean().item()
    assert abs(ratio_replay - 1) <= math.expm1(tol)  # the bound above, as a ratio
    assert ratio_full < 0.95  # the kept mass, about top_p on this near-uniform model
    # the kept set is the warper's: its mass under the model reaches top_p
    probs = torch.exp(naive_full_logprobs_all(model, batch))  # (B, T, V)
    mass = (probs.gather(-1, kept.clamp(min=0)) * (kept != PAD)).sum(-1)
    assert (mass[mask] >= 0.8 - tol).all()  # each probability within rounding of the sampler's


def naive_full_logprobs_all(model, batch) -> torch.Tensor:
    """(B, T, V) log-softmax of every response position's logits from one unpadded forward per row."""
    out = torch.zeros(*batch.response_ids.shape, model.config.vocab_size)
    with torch.no_grad():
        for i in range(len(batch)):
            prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()]
            resp = batch.response_ids[i][batch.response_mask[i].bool()]
            logits = model(input_ids=torch.cat([prompt, resp])[None]).logits[0].float()
            out[i, :len(resp)] = torch.log_softmax(logits[len(prompt) - 1: len(prompt) - 1 + len(resp)], -1)
    return out


@pytest.mark.parametrize("chunk", [1024, 0])
def test_the_replayed_gradient_is_the_naive_per_token_loop(model, tok, chunk):
    batch = sampled(model, tok, "rlft", top_k=20, top_p=0.9)
    kept = batch.rollout_kept
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad()
    trainer_logp(model, batch, kept, chunk=chunk).mul(batch.response_mask).sum().backward()
    fast = [p.grad.clone() for p in params]
    model.zero_grad()
    scale = AbsGradSum(model)
    for i in range(len(batch)):  # one token at a time, its dropped logits at -inf
        prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()]
        resp = batch.response_ids[i][batch.response_mask[i].bool()]
        for t in range(len(resp)):
            logits = model(input_ids=torch.cat([prompt, resp[:t + 1]])[None]).logits[0, -2].float()
            ids = [v for v in kept[i, t].tolist() if v >= 0]
            dropped = torch.ones_like(logits, dtype=torch.bool)
            dropped[ids] = False
            torch.log_softmax(logits.masked_fill(dropped, float("-inf")), -1)[resp[t]].backward()
    for h in scale.handles:
        h.remove()
    n = model_reduction_len(model, batch)
    for p, g, (name, _) in zip(params, fast, [(n_, p_) for n_, p_ in model.named_parameters() if p_.requires_grad]):
        assert_rounding_close(g, p.grad, n_terms=n, scale=scale.scale(name),
                              depth=MODEL_DEPTH, what=f"grad {name}")


def test_min_p_and_top_k_keep_what_they_say(model, tok):
    batch = sampled(model, tok, "rlft", top_p=1.0, top_k=5)
    mask = batch.response_mask.bool()
    assert ((batch.rollout_kept != PAD).sum(-1)[mask] == 5).all()
    batch = sampled(model, tok, "rlft", top_p=1.0, min_p=0.9)
    probs = torch.exp(naive_full_logprobs_all(model, batch))
    kept = batch.rollout_kept
    kept_p = probs.gather(-1, kept.clamp(min=0)).masked_fill(kept == PAD, float("inf"))
    top = probs.max(-1).values
    assert (kept_p.min(-1).values[mask] >= 0.9 * top[mask] - 1e-6).all()


def test_without_truncation_the_samplers_change_nothing(model, tok):
    for sampler in ("rlft", "generate"):
        a = sampled(model, tok, sampler, replay=True, top_p=1.0)
        b = sampled(model, tok, sampler, replay=False, top_p=1.0)
        assert a.rollout_kept is None and b.rollout_kept is None
        assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.rollout_logp, b.rollout_logp)


def test_multi_turn_trajectories_carry_the_kept_sets(model, tok):
    run = turn_sampler(model, tok, top_p=0.8, continuing=True, replay=True)
    torch.manual_seed(1)
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS[:2]]
    s = run(ids, 1, 6)
    trajs = []
    for j, prompt in enumerate(ids):
        n = int(s.response_mask[j].sum())
        tr = Trajectory(prompt=prompt, messages=[])
        tr.add(s.response_ids[j, :n].tolist(), "policy", "", s.logprobs[j, :n].tolist(), 0, None,
               [[v for v in row if v >= 0] for row in s.kept[j, :n].tolist()])
        tr.add([5, 6], "env", "ok")
        trajs.append(tr)
    batch = trajectories_batch(trajs, tok, 1, exact=True)
    env = batch.env_mask.bool()
    policy = batch.action_mask.bool()
    assert (batch.rollout_kept[env] == PAD).all() and ((batch.rollout_kept != PAD).any(-1) == policy).all()
    with torch.no_grad():
        replayed = trainer_logp(model, batch, batch.rollout_kept)
    assert_scores_what_was_drawn(model, batch, replayed, policy, "multi-turn")
    wide, narrow = sampled(model, tok, "rlft"), sampled(model, tok, "rlft", top_k=3)
    both = cat_batches([narrow, wide])  # kept sets of other widths and lengths pad with -1
    assert both.rollout_kept.shape[-1] == wide.rollout_kept.shape[-1] > narrow.rollout_kept.shape[-1] == 3
    assert torch.equal(both.index(slice(0, len(narrow))).rollout_kept[:, :narrow.rollout_kept.shape[1], :3],
                       narrow.rollout_kept)
    assert (both.rollout_kept[:len(narrow), :, 3:] == PAD).all()


def _run(tmp_path, name, tiny_overrides, *extra):
    run_dir = tmp_path / name
    proc = subprocess.run([sys.executable, "-m", "rlft", "train", *tiny_overrides(run_dir, "train.steps=2",
                                                                                 "eval.before_rl=false", *extra)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in next(run_dir.glob("*/metrics.jsonl")).read_text().splitlines()]
    return [r for r in rows if "rollout_corr/logp_gap_mean" in r]


def test_a_run_at_top_p_trains_on_what_it_sampled_and_without_truncation_nothing_changes(tmp_path, tiny_overrides):
    replayed = _run(tmp_path, "replay", tiny_overrides, "rollout.top_p=0.8")
    plain = _run(tmp_path, "plain", tiny_overrides, "rollout.top_p=0.8", "rollout.replay_support=false")
    assert replayed and plain
    assert max(r["rollout_corr/logp_gap_mean"] for r in replayed) < 0.01  # rounding (about 1e-7 here)
    assert min(r["rollout_corr/logp_gap_mean"] for r in plain) > 0.05  # |log S|: the kept mass is about 0.8
    on = _run(tmp_path, "on", tiny_overrides, "rollout.replay_support=true")
    off = _run(tmp_path, "off", tiny_overrides, "rollout.replay_support=false")
    def measured(rows):  # every metric but the clocks
        return [{k: v for k, v in r.items() if not k.startswith(("perf/", "timing_s/"))} for r in rows]

    assert measured(on) == measured(off) and len(measured(on)[0]) > 20


def test_partial_rollouts_carry_the_kept_sets_across_segments(model, tok):
    from rlft.rollout.partial import PartialRollouts, finished_batch

    run = turn_sampler(model, tok, top_p=0.8, replay=True)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    pr = PartialRollouts(budget=3, max_new_tokens=9, group_size=2)
    torch.manual_seed(2)
    done, step = [], 0
    while len(done) < 2:
        done += pr.collect(run, prompts, lambda k: list(range(k)), n_groups=2, step=step)
        step += 1
    batch = finished_batch(done, prompts, tok, step)
    mask = batch.response_mask.bool()
    assert batch.rollout_kept is not None and (batch.response_mask.sum(1) > 3).any()  # some took several segments
    assert (batch.rollout_kept == batch.response_ids[..., None]).any(-1)[mask].all()
    with torch.no_grad():  # the weights did not change between segments: the replay scores what was drawn
        replayed = trainer_logp(model, batch, batch.rollout_kept)
    assert_scores_what_was_drawn(model, batch, replayed, mask, "partial rollouts")
    pr2 = PartialRollouts(budget=3, max_new_tokens=9, group_size=2)
    pr2.load_state_dict(pr.state_dict())  # the kept sets of the groups in flight survive a checkpoint
    assert [g.kept for g in pr2.pending] == [g.kept for g in pr.pending]


def test_with_the_replay_off_the_exact_sampler_is_not_corrected_by_the_kept_mass(tmp_path, tiny_overrides):
    """rollout.replay_support=false keeps the trainer on the whole vocabulary; algo.rollout_correction=auto must not
    then weight each token by pi_old / mu = S (the kept mass), which would shrink the gradient a second time."""
    from rlft.recipe import load_config
    from rlft.rollout.hf import samples_exactly
    from rlft.trainers.update import rollout_correction

    cfg = load_config(None, tiny_overrides(tmp_path, "rollout.top_p=0.8", "rollout.replay_support=false"))
    assert samples_exactly(cfg) and rollout_correction(cfg) == "off"
