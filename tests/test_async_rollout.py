"""One-step-off-policy rollouts (train.async_rollout, issue 34): the synchronous loop at max_staleness 0, the weights
each batch was sampled with, the rollout correction of the stale batches, resume with a rollout in flight, refusals."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
from safetensors.torch import load_file

from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.rollout import decode
from rlft.stages.pipeline import run_pipeline
from rlft.trainers import rl, update as update_module
from test_algorithms import run  # noqa: F401  (the fixture)
from test_pipeline import NON_DETERMINISTIC, quiet, read_jsonl

ASYNC = ("train.async=true", "optim.lr=1e-2")  # the issue's key; the field is train.async_rollout
CORR_KEYS = ("rollout_corr/logp_gap_mean", "rollout_corr/logp_gap_max", "rollout_corr/kl", "rollout_corr/ratio_max",
             "rollout_corr/masked_frac")


def deterministic(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(NON_DETERMINISTIC)}


def checksum(model) -> str:
    """A digest of the model's weights (a float sum can miss a small update)."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def test_random_stream_is_the_threads_own():
    probs = torch.softmax(torch.randn(6, 50, generator=torch.Generator().manual_seed(1)), -1)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    with decode.random_stream(torch.Generator().manual_seed(7)):
        a = decode.draw(probs)
    assert torch.equal(torch.get_rng_state(), before)  # the global generator did not move
    with decode.random_stream(torch.Generator().manual_seed(7)):
        assert torch.equal(decode.draw(probs), a)
    assert getattr(decode._STREAM, "generator", None) is None  # restored on exit


def test_max_staleness_zero_is_the_synchronous_run(run):
    sync_dir, sync, _ = run("optim.lr=1e-2", name="sync")
    async_dir, same, cfg = run(*ASYNC, "train.max_staleness=0", name="async0")
    assert cfg.train.async_rollout and not cfg.train.overlapped
    assert [deterministic(r) for r in same] == [deterministic(r) for r in sync]  # bit for bit
    assert all("async/staleness" not in r for r in same)
    a, b = load_file(sync_dir / "policy" / "model.safetensors"), load_file(async_dir / "policy" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_each_batch_is_sampled_with_the_weights_before_the_previous_update(run, monkeypatch):
    sampled, before_update, modes = [], [], []
    generate, update, corrected = rl.generate, rl.update, update_module.corrected

    def recording_generate(model, *args, **kwargs):
        sampled.append(checksum(model))  # in the rollout thread, on the sampler copy
        return generate(model, *args, **kwargs)

    def recording_update(state, batch, cfg, **kwargs):
        before_update.append(checksum(state.policy))
        return update(state, batch, cfg, **kwargs)

    def recording_corrected(pg_mat, old_logp, micro, mask, mode, a):
        modes.append((micro.staleness, mode))
        return corrected(pg_mat, old_logp, micro, mask, mode, a)

    monkeypatch.setattr(rl, "generate", recording_generate)
    monkeypatch.setattr(rl, "update", recording_update)
    monkeypatch.setattr(update_module, "corrected", recording_corrected)
    _, records, cfg = run(*ASYNC, "train.steps=4", "algo.epochs=2", name="async1")
    assert len(sampled) == len(before_update) == 4
    assert sampled[0] == before_update[0]  # the first batch: the initial weights
    moved = [t for t in range(1, 4) if before_update[t - 1] != before_update[t]]  # update t changed the weights
    assert len(moved) >= 2, [r["actor/grad_norm"] for r in records]  # (a first group of equal rewards moves nothing)
    for t in range(1, 4):  # batch t+1: the weights before update t, one update behind those it trains
        assert sampled[t] == before_update[t - 1], t
        assert (sampled[t] != before_update[t]) == (t in moved), t
    assert [r["async/staleness"] for r in records] == [0.0, 1.0, 1.0, 1.0]
    # auto: the exact sampler's fresh batch uncorrected, the stale ones by token_tis
    assert {m for s, m in modes if s == 0} == {"off"} and {m for s, m in modes if s == 1} == {"token_tis"}
    for r in records:
        for key in CORR_KEYS:
            assert math.isfinite(r[key]), (key, r)
    assert all(r["rollout_corr/logp_gap_mean"] > 0 for r in records[1:])  # pi_old is not the sampler's policy
    assert all(r["timing_s/async_wait"] >= 0 for r in records)


def test_lora_one_step_off_trains_and_shares_the_base(run, monkeypatch):
    from rlft.trainers.async_rollout import AsyncRollouts

    made = []
    init = AsyncRollouts.__init__

    def recording_init(self, state, cfg):
        init(self, state, cfg)
        made.append((self, state.policy))

    monkeypatch.setattr(AsyncRollouts, "__init__", recording_init)
    _, records, _ = run(*ASYNC, "lora.rank=4", "algo.kl_coef=0.1", name="lora")
    (rollouts, policy), = made
    copies = {id(p) for p, _ in rollouts._pairs}
    own = dict(rollouts.model.named_parameters())
    for name, p in policy.named_parameters():  # the base shared, the adapters copied
        assert (own[name] is p) != p.requires_grad
        assert (id(own[name]) in copies) == p.requires_grad
    assert any(p.requires_grad for p in policy.parameters())
    assert [r["async/staleness"] for r in records] == [0.0, 1.0, 1.0]


def test_resume_with_a_rollout_in_flight_repeats_the_run(tmp_path, tiny_overrides, digit_reward):
    from rlft.runs import checkpoint

    def cfg(name: str, *extra: str):
        return load_config(None, tiny_overrides(tmp_path, f"log.name={name}", "train.steps=4", "train.save_every=2",
                                                "sft.steps=0", "eval.before_rl=false", "eval.ks=[]", *ASYNC,
                                                *digit_reward, *extra))

    run_dir = run_pipeline(cfg("whole"), echo=quiet).run_dir
    whole = read_jsonl(run_dir / "metrics.jsonl")
    saved = checkpoint.load_state(run_dir / "checkpoints" / "step_000002")["trainer"]["async"]
    assert saved["step"] == 3 and saved["sampled_at"] == 1 and len(saved["batch"]["texts"]) > 0

    with pytest.raises(ConfigError, match=r"^train.async_rollout: cannot change when resuming .*a rollout sampled ahead"):  # the batch is not dropped
        run_pipeline(cfg("whole", "train.resume=true", "train.async_rollout=false"), echo=quiet)
    lines: list[str] = []
    run_pipeline(cfg("whole", "train.resume=true"), echo=lines.append)
    assert any("resumed" in line and "step_000002" in line for line in lines)
    resumed = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert [deterministic(r) for r in resumed] == [deterministic(r) for r in whole]


@pytest.mark.parametrize("override, key", [
    ("train.max_staleness=2", "train.max_staleness"),
    ("rollout.sampler=generate", "train.async_rollout"),
    ("rollout.sampler=vllm", "train.async_rollout"),
    ("env.name=tools", "train.async_rollout"),
])
def test_what_it_cannot_run_is_refused_naming_the_key(tmp_path, tiny_overrides, override, key):
    with pytest.raises(ConfigError, match=key):
        load_config(None, tiny_overrides(tmp_path, "train.async_rollout=true", override))


def test_several_processes_are_refused(tmp_path, tiny_overrides):
    from rlft.parallel.dist import Dist
    from rlft.trainers.async_rollout import check
    from rlft.trainers.state import RLState

    state = RLState(policy=torch.nn.Linear(1, 1), tokenizer=None, optimizer=None, scheduler=None, sampler=None,
                    examples=[], prompts=[], dist=Dist(rank=0, world=2))
    with pytest.raises(ConfigError, match="train.async_rollout: runs in one process; this run has 2"):
        check(state, load_config(None, tiny_overrides(tmp_path, "train.async_rollout=true")))


def test_train_async_is_the_field_async_rollout(tmp_path):
    assert load_config(None, ["train.async=true"]).train.async_rollout is True
    assert load_config(None, []).train.async_rollout is False
    assert load_config(None, ["train.async=true", "train.async_rollout=false"]).train.async_rollout is False  # later
    assert load_config(None, ["train.async_rollout=false", "train.async=true"]).train.async_rollout is True
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train: {async: true}\n")
    assert load_config(recipe).train.async_rollout is True
    assert load_config(recipe, ["train.async_rollout=false"]).train.async_rollout is False
    recipe.write_text("train: {async: true, async_rollout: false}\n")
    with pytest.raises(ConfigError, match=r"train\.async: is train\.async_rollout under another name"):
        load_config(recipe)
