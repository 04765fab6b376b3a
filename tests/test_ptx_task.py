"""PPO-ptx with ``data.ptx_source=task``: the ptx texts are the training rows as the SFT stage renders them."""

from __future__ import annotations

import json

import pytest
import torch

from rlft.recipe import load_config
from rlft.data.schema import DataError
from rlft.models.loading import load_policy
from rlft.data.task import load_task
from rlft.stages.pipeline import run_pipeline
from rlft.trainers.ptx import TASK_SOURCE, PtxData, lm_loss, task_texts
from rlft.trainers.sft import sft_examples, sft_pairs, sft_step_loss
from test_pipeline import quiet


@pytest.fixture
def make_cfg(tmp_path, tiny_size_overrides, tiny_model_dir):
    """make_cfg(*overrides): a seconds-long run's config on the tiny model (12 training rows of synthetic:max)."""

    def make(*extra):
        return load_config(None, tiny_size_overrides(tmp_path, f"model.path={tiny_model_dir}", "log.name=r",
                                                     "data.synth_train_size=12", "eval.ks=[1]",
                                                     "eval.before_rl=false", "optim.warmup_steps=0", *extra))

    return make


@pytest.mark.parametrize("loss_on", ["response", "all", "answer"])
@pytest.mark.parametrize("system_prompt", ["", "Answer after ####."])
def test_task_texts_are_the_sft_renderings(make_cfg, loss_on, system_prompt):
    cfg = make_cfg(f"sft.loss_on={loss_on}", f"sft.system_prompt={system_prompt!r}")
    policy, tok = load_policy(cfg.model.path, cfg.model)
    train_ex = load_task(cfg)[0]
    ids, weights = task_texts(train_ex, tok, cfg)
    items = sft_pairs(sft_examples(cfg, train_ex), tok, cfg)  # what the SFT stage trains on
    assert len(ids) == len(items) == len(train_ex) == 12
    for x, w, (p, t, sw) in zip(ids, weights, items):
        assert x == p + t
        assert w == [0] * len(p) + sw  # the weight of predicting each token
        assert x[-1] == tok.eos_token_id
        assert len(x) == len(w)
    if system_prompt:  # the system prompt is part of the rendering
        plain = task_texts(train_ex, tok, make_cfg(f"sft.loss_on={loss_on}"))[0]
        assert all(len(a) > len(b) for a, b in zip(ids, plain))
    if loss_on == "answer":  # only the final answer and eos: fewer weighted tokens than the response
        resp = task_texts(train_ex, tok, make_cfg("sft.loss_on=response"))[1]
        assert all(0 < sum(a) <= sum(b) for a, b in zip(weights, resp))

    # One text at a time, the ptx loss is the SFT loss of that row (the same tokens, the same mask).
    policy.eval()
    with torch.no_grad():
        for x, w, item in list(zip(ids, weights, items))[:4]:
            ptx = lm_loss(policy, torch.tensor([x]), torch.ones(1, len(x), dtype=torch.long), torch.tensor([w]))
            sft, _, _ = sft_step_loss(policy, [item], tok.pad_token_id)
            torch.testing.assert_close(ptx, sft, rtol=1e-5, atol=1e-6)


def test_padded_batch_loss_is_the_token_mean_over_rows(make_cfg):
    cfg = make_cfg("data.ptx_source=task", "algo.ptx_coef=1.0", "train.ptx_batch_size=5")
    policy, tok = load_policy(cfg.model.path, cfg.model)
    policy.eval()
    data = PtxData.from_config(cfg, tok, load_task(cfg)[0])
    ids, mask, w = data.sample()
    assert ids.shape[0] == 5 and ids.shape == mask.shape == w.shape
    assert (w * (1 - mask)).sum() == 0  # no weight on padding
    with torch.no_grad():
        batch = lm_loss(policy, ids, mask, w)
        total, count = 0.0, 0
        for i in range(5):
            n = int(mask[i].sum())
            row = lm_loss(policy, ids[i: i + 1, :n], mask[i: i + 1, :n], w[i: i + 1, :n])
            k = int(w[i, 1:n].sum())
            total, count = total + row.item() * k, count + k
    assert batch.item() == pytest.approx(total / count, rel=1e-5)


def test_sampling_is_seeded_and_restorable(make_cfg):
    cfg = make_cfg("data.ptx_source=task", "algo.ptx_coef=1.0", "train.ptx_batch_size=3")
    _, tok = load_policy(cfg.model.path, cfg.model)
    train_ex = load_task(cfg)[0]
    a, b = PtxData.from_config(cfg, tok, train_ex), PtxData.from_config(cfg, tok, train_ex)
    a.sample()
    saved = a.state_dict()
    first = a.sample()
    b.load_state_dict(saved)
    for x, y in zip(first, b.sample()):
        assert torch.equal(x, y)


def test_max_tokens_cut_that_leaves_nothing_to_predict_is_an_error(make_cfg):
    # The prompt alone is longer than 2 tokens and carries no weight with loss_on=response.
    cfg = make_cfg("data.ptx_source=task", "algo.ptx_coef=1.0", "data.ptx_max_tokens=2")
    _, tok = load_policy(cfg.model.path, cfg.model)
    with pytest.raises(DataError, match=r"data.ptx_source task: row 0 .*data.ptx_max_tokens=2"):
        PtxData.from_config(cfg, tok, load_task(cfg)[0])


def test_ptx_coef_without_source_names_the_key(make_cfg):
    from rlft.config import ConfigError

    with pytest.raises(ConfigError, match="algo.ptx_coef"):
        make_cfg("algo.ptx_coef=0.5")


def test_tiny_ppo_run_with_task_ptx(make_cfg):
    cfg = make_cfg("algo.preset=ppo", f"data.ptx_source={TASK_SOURCE}",
               "algo.ptx_coef=1.0", "train.ptx_batch_size=4", "optim.lr=1e-2")
    run_dir = run_pipeline(cfg, echo=quiet).run_dir
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3
    losses = [r["actor/ptx_loss"] for r in records]
    assert all(0 < x < 20 for x in losses)
    # The tiny model starts near uniform over its vocabulary: the first ptx loss is about log(V).
    _, tok = load_policy(cfg.model.path, cfg.model)
    assert losses[0] == pytest.approx(float(torch.log(torch.tensor(float(len(tok))))), rel=0.25)
