"""Partial rollouts (rollout.partial_tokens, rlft.rollout.partial): responses sampled a budget at a time, across
steps, each token kept with the sampler's log-prob; the groups in flight checkpointed and resumed exactly."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.rollout.batch import right_pad
from rlft.rollout.decode import Sampled
from rlft.rollout.partial import PartialRollouts, finished_batch, partial_metrics
from rlft.stages.pipeline import run_pipeline
from test_algorithms import run  # noqa: F401  (the fixture)
from test_async_rollout import deterministic
from test_pipeline import quiet, read_jsonl

STOP = 2


def token(j: int, p: int) -> int:
    """The fake sampler's token at response position p of sample j: never the stop token."""
    return 1000 + 100 * j + p


class FakeSampler:
    """A deterministic stand-in for the sampler: response j of prompt i (``[100 + i]``) is ``token(j, 0..)`` and
    ends with the stop token at position ``lengths[i][j] - 1``; each token's log-prob is -(p + 1) / 100. A context
    longer than the prompt continues from its last token. Records every call."""

    def __init__(self, lengths: dict[int, list[int]]):
        self.lengths, self.calls = lengths, []

    def __call__(self, contexts: list[list[int]], group_size: int, max_new_tokens: int) -> Sampled:
        self.calls.append((len(contexts), group_size, max_new_tokens))
        rows, logps, truncated = [], [], []
        for c in contexts:
            i = c[0] - 100
            for k in range(group_size):
                if len(c) == 1:
                    j, p = k, 0
                else:
                    j, p = (c[-1] - 1000) // 100, (c[-1] - 1000) % 100 + 1
                end = self.lengths[i][j] - 1  # the stop token's position
                out = [STOP if q == end else token(j, q) for q in range(p, min(end + 1, p + max_new_tokens))]
                rows.append(out)
                logps.append([-(q + 1) / 100 for q in range(p, p + len(out))])
                truncated.append(out[-1] != STOP)
        ids, mask = right_pad(rows, 0)
        lp = torch.zeros(ids.shape)
        for r, v in enumerate(logps):
            lp[r, :len(v)] = torch.tensor(v)
        n = len(rows)
        return Sampled(prompt_ids=torch.zeros(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1, dtype=torch.long),
                       response_ids=ids, response_mask=mask, truncated=torch.tensor(truncated), logprobs=lp)


def whole(lengths: dict[int, list[int]], i: int, j: int, max_new: int) -> tuple[list[int], list[float], bool]:
    """Response j of prompt i sampled in one go (the naive reference): tokens, log-probs, ended by the stop token."""
    n = min(lengths[i][j], max_new)
    toks = [STOP if q == lengths[i][j] - 1 else token(j, q) for q in range(n)]
    return toks, [-(q + 1) / 100 for q in range(n)], toks[-1] == STOP


class Draw:
    """``take(k)``: prompt indices 0, 1, 2, ... in order."""

    def __init__(self):
        self.next = 0

    def __call__(self, k: int) -> list[int]:
        out = list(range(self.next, self.next + k))
        self.next += k
        return out


def test_hand_made_two_steps():
    """G = 2, budget 3, max_new 8, P = 2. Prompt 0's responses end after 2 and 5 tokens, prompt 1's after 4 and 12
    (cut at 8). Step 0: segment 1 gives 0: (2 done, 3), 1: (3, 3); nothing finished, so segment 2: 0: (2, 5 done)
    finished; 1: (4 done, 6). Step 1: prompt 2 (lengths 1, 1) joins; one segment: 1: (4, 8 cut) finished, 2: (1, 1)
    finished."""
    lengths = {0: [2, 5], 1: [4, 12], 2: [1, 1], 3: [9, 9]}
    fake, take = FakeSampler(lengths), Draw()
    pr = PartialRollouts(budget=3, max_new_tokens=8, group_size=2)
    prompts = [[100 + i] for i in range(4)]
    done = pr.collect(fake, prompts, take, n_groups=2, step=0)
    assert [g.index for g in done] == [0] and [g.index for g in pr.pending] == [1]
    assert fake.calls == [(2, 2, 3), (3, 1, 3)]  # the fresh groups' shared prefill, then 3 continued responses
    assert [len(t) for t in pr.pending[0].tokens] == [4, 6] and pr.pending[0].done == [True, False]
    done = pr.collect(fake, prompts, take, n_groups=2, step=1)
    assert [g.index for g in done] == [1, 2] and pr.pending == []
    assert fake.calls[2:] == [(1, 2, 3), (1, 1, 2)]  # prompt 2 fresh; prompt 1's response 1 with 2 tokens of room
    g1 = done[0]
    assert g1.started == 0 and g1.carried == [4, 6] and g1.ended == [True, False]
    for j in range(2):
        toks, lps, ended = whole(lengths, 1, j, 8)
        assert g1.tokens[j] == toks and g1.logps[j] == pytest.approx(lps) and g1.ended[j] == ended
    m = partial_metrics(done, len(pr.pending), step=1)
    assert m == {"partial/finished_groups": 2.0, "partial/pending_groups": 0.0,
                 "partial/carried_token_frac": pytest.approx(10 / (4 + 8 + 1 + 1)), "partial/max_staleness": 1.0}


@pytest.mark.parametrize("budget", [1, 2, 3, 5, 8, 20])
def test_every_finished_response_is_the_one_sampled_whole(budget):
    """Whatever the budget, each trained response is the same tokens and log-probs as sampled in one go (naive
    reference), and every prompt drawn is trained on once or is still in flight."""
    g = torch.Generator().manual_seed(budget)
    lengths = {i: torch.randint(1, 14, (3,), generator=g).tolist() for i in range(40)}
    fake, take = FakeSampler(lengths), Draw()
    pr = PartialRollouts(budget=budget, max_new_tokens=10, group_size=3)
    prompts = [[100 + i] for i in range(40)]
    seen = []
    for step in range(8):
        for grp in pr.collect(fake, prompts, take, n_groups=4, step=step):
            seen.append(grp.index)
            for j in range(3):
                toks, lps, ended = whole(lengths, grp.index, j, 10)
                assert grp.tokens[j] == toks and grp.ended[j] == ended
                assert grp.logps[j] == pytest.approx(lps, abs=1e-6)
        assert len(pr.pending) <= 4
        assert all(max(len(t) for t in p.tokens) <= 10 for p in pr.pending)
    assert len(set(seen)) == len(seen)  # no group trained twice; every drawn one finished or still in flight
    assert set(seen) | {p.index for p in pr.pending} == set(range(take.next)) and not set(seen) & {
        p.index for p in pr.pending}
    if budget >= 10:  # one segment finishes every group: nothing is ever carried
        assert seen == list(range(32)) and pr.pending == []


def test_state_dict_round_trip_continues_identically():
    lengths = {i: [(i * 7 + j * 3) % 11 + 1 for j in range(2)] for i in range(30)}
    prompts = [[100 + i] for i in range(30)]
    a, take_a = PartialRollouts(2, 9, 2), Draw()
    for step in range(3):
        a.collect(FakeSampler(lengths), prompts, take_a, 3, step)
    b, take_b = PartialRollouts(2, 9, 2), Draw()
    b.load_state_dict(a.state_dict())
    take_b.next = take_a.next
    for step in range(3, 6):
        got_a = a.collect(FakeSampler(lengths), prompts, take_a, 3, step)
        got_b = b.collect(FakeSampler(lengths), prompts, take_b, 3, step)
        assert [vars(x) for x in got_a] == [vars(x) for x in got_b]
    with pytest.raises(ValueError, match="algo.group_size=3"):
        PartialRollouts(2, 9, 3).load_state_dict(a.state_dict())


def test_finished_batch_layout():
    lengths = {0: [2, 5], 1: [4, 12]}
    pr = PartialRollouts(budget=3, max_new_tokens=8, group_size=2)
    done = pr.collect(FakeSampler(lengths), [[100], [101]], Draw(), n_groups=2, step=0)
    done += pr.collect(FakeSampler(lengths), [[100], [101]], lambda k: [], n_groups=2, step=1)

    class Tok:
        pad_token_id = 0

        def batch_decode(self, ids, skip_special_tokens=True):
            return [" ".join(str(t) for t in row.tolist() if t != 0) for row in ids]

    b = finished_batch(done, [[100], [101, 7]], Tok(), step=1)
    assert b.group_size == 2 and len(b) == 4 and b.staleness == 1
    assert b.prompt_ids.tolist() == [[0, 100], [0, 100], [101, 7], [101, 7]]
    assert b.response_mask.sum(1).tolist() == [2, 5, 4, 8] and b.truncated.tolist() == [False, False, False, True]
    assert b.response_ids[3, :8].tolist() == [token(1, q) for q in range(8)]
    assert b.rollout_logp[1, :5].tolist() == pytest.approx([-(q + 1) / 100 for q in range(5)])
    assert (b.rollout_logp[b.response_mask == 0] == 0).all()
    assert b.texts[0] == str(token(0, 0)) and b.texts[3].split()[-1] == str(token(1, 7))  # stop hidden, cut kept


@pytest.fixture
def ragged(monkeypatch):
    """rlft's sampler with each response ended (its stop token written over the sampled one) where its context
    plus response first reaches a multiple of 5 tokens: the tiny model's responses otherwise all run to the budget
    together, and groups that finish together leave nothing in flight."""
    from rlft.rollout import hf

    real = hf.SAMPLERS.get("rlft")

    def cut(model, prompts, **kw):
        s = real(model, prompts, **kw)
        ids, mask, lp, trunc = s.response_ids.clone(), s.response_mask.clone(), s.logprobs.clone(), s.truncated.clone()
        for r in range(ids.shape[0]):
            ctx = len(prompts[r // kw["group_size"]])
            for k in range(int(mask[r].sum())):
                if (ctx + k + 1) % 5 == 0:
                    ids[r, k], trunc[r] = kw["stops"][0], False
                    ids[r, k + 1:], mask[r, k + 1:], lp[r, k + 1:] = kw["pad_id"], 0, 0.0
                    break
        return Sampled(s.prompt_ids, s.prompt_mask, ids, mask, trunc, lp)

    monkeypatch.setitem(hf.SAMPLERS._items, "rlft", cut)


def test_a_run_with_a_budget_trains_and_logs(run, ragged):
    run_dir, records, cfg = run("rollout.partial_tokens=2", "rollout.max_new_tokens=12", "train.steps=4",
                                "train.prompts_per_step=4", name="partial")
    assert cfg.rollout.partial_tokens == 2
    for r in records:
        assert 1 <= r["partial/finished_groups"] and 0 <= r["partial/carried_token_frac"] <= 1
        assert all(math.isfinite(v) for v in r.values() if isinstance(v, float))
    assert any(r["partial/pending_groups"] > 0 for r in records)


def test_a_budget_of_the_whole_response_is_the_plain_run(run):
    """partial_tokens = max_new_tokens: every group finishes in its first segment, sampled by the same call as
    without partial rollouts: the same metrics bit for bit."""
    _, plain, _ = run("rollout.max_new_tokens=8", name="plain")
    _, part, _ = run("rollout.max_new_tokens=8", "rollout.partial_tokens=8", name="budget8")
    strip = [{k: v for k, v in deterministic(r).items() if not k.startswith("partial/")} for r in part]
    assert strip == [deterministic(r) for r in plain]
    assert all(r["partial/pending_groups"] == 0 and r["partial/carried_token_frac"] == 0 for r in part)


def test_resume_with_groups_in_flight_repeats_the_run(tmp_path, tiny_overrides, digit_reward, ragged):
    from rlft.runs import checkpoint

    def cfg(name: str, *extra: str):
        return load_config(None, tiny_overrides(tmp_path, f"log.name={name}", "train.steps=4", "train.save_every=3",
                                                "sft.steps=0", "eval.before_rl=false", "eval.ks=[]",
                                                "rollout.max_new_tokens=12", "rollout.partial_tokens=2",
                                                "train.prompts_per_step=4", "optim.lr=1e-2", *digit_reward,
                                                *extra))

    run_dir = run_pipeline(cfg("whole"), echo=quiet).run_dir
    whole_run = read_jsonl(run_dir / "metrics.jsonl")
    saved = checkpoint.load_state(run_dir / "checkpoints" / "step_000003")["trainer"]["partial"]
    assert saved["group_size"] == 2 and len(saved["pending"]) > 0  # groups in flight at the checkpoint
    with pytest.raises(ValueError, match="rollout.partial_tokens"):
        run_pipeline(cfg("whole", "train.resume=true", "rollout.partial_tokens=0"), echo=quiet)
    run_pipeline(cfg("whole", "train.resume=true"), echo=quiet)
    resumed = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert [deterministic(r) for r in resumed] == [deterministic(r) for r in whole_run]


@pytest.mark.parametrize("override", ["env.name=tools", "algo.dynamic_sampling=true", "train.async_rollout=true",
                                      "rollout.partial_tokens=-1"])
def test_what_it_cannot_run_is_refused_naming_the_key(tmp_path, tiny_overrides, override):
    extra = [] if override.startswith("rollout.partial") else ["rollout.partial_tokens=4"]
    with pytest.raises(ConfigError, match="rollout.partial_tokens"):
        load_config(None, tiny_overrides(tmp_path, *extra, override))
