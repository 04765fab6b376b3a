"""Process supervision end to end: the chain task, the chain_steps checker, the step-level reward interface
(score_batch), steps on tokens (char and BPE tokenizers), the config checks and an RL step with
``algo.advantage=process``."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.rewards.chain import chain_steps_of
from rlft.data.synthetic import synthetic_task
from rlft.models.tiny import build_tokenizer
from rlft.rewards import REWARDS, score_batch, step_level
from rlft.core.advantages import process_advantages
from rlft.models.tokens import step_end_positions
from rlft.rewards.steps import step_metrics, step_tensors

CHAIN = {"prompt": ({"role": "user", "content": "12+7-5+3=? Answer after ####."},), "ground_truth": "17"}
PROCESS = ["data.source=synthetic:chain", "data.synth_max_operand=9", "algo.advantage=process",
           "reward.fns=[chain_steps]", "reward.weights=[1.0]"]


# ----------------------------------------------------------------------------- the task and its checker


def test_chain_task_reference_is_right_step_by_step():
    train, held_out = synthetic_task("chain", n_train=30, n_eval=10, max_operand=9, ops="+-*")
    assert not {e.prompt[0]["content"] for e in train} & {e.prompt[0]["content"] for e in held_out}
    check = REWARDS.get("chain_steps")
    for ex in train + held_out:
        lines = ex.response.split("\n")
        assert len(lines) == 4 and lines[-1] == f"#### {ex.ground_truth}"
        steps = check(ex.response, ex.to_mapping())
        assert [r for _, r in steps] == [1.0] * 4
        assert [e for e, _ in steps] == [sum(len(x) + 1 for x in lines[:i + 1]) - 1 for i in range(4)]
        assert REWARDS.get("final_answer")(ex.response, ex.to_mapping()) == 1.0


def test_chain_verbose_is_chain_with_about_half_its_lines_spaced_and_checked_alike():
    """chain_verbose: chain's problems and answers, each working line either chain's or the same with spaces
    around its operator and '=' (4 characters more); both checkers score every reference right."""
    plain = synthetic_task("chain", n_train=150, n_eval=50, max_operand=9, ops="+-*", seed=3)
    verbose = synthetic_task("chain_verbose", n_train=150, n_eval=50, max_operand=9, ops="+-*", seed=3)
    spaced = 0
    for a, b in zip(plain[0] + plain[1], verbose[0] + verbose[1]):
        assert (a.prompt, a.ground_truth) == (b.prompt, b.ground_truth)
        for x, y in zip(a.response.split("\n"), b.response.split("\n"), strict=True):
            assert y == x or (y.replace(" ", "") == x and len(y) == len(x) + 4)
            spaced += y != x
        assert [r for _, r in REWARDS.get("chain_steps")(b.response, b.to_mapping())] == [1.0] * 4
        assert REWARDS.get("final_answer")(b.response, b.to_mapping()) == 1.0
    assert 0.4 < spaced / (200 * 3) < 0.6  # 600 fair coin flips: 0.5 +- 0.1 is 4.9 standard deviations


def test_chain_steps_hand_cases():
    check = REWARDS.get("chain_steps")
    assert chain_steps_of("12+7-5+3=?") == [(12, "+", 7, 19), (19, "-", 5, 14), (14, "+", 3, 17)]
    #                     ends:  7         15        23        31
    assert check("12+7=19\n19-5=14\n14+3=17\n#### 17", CHAIN) == [(7, 1.0), (15, 1.0), (23, 1.0), (31, 1.0)]
    # an error at step 2 is not rewarded again later: step 3 chains from the wrong 13
    assert check("12+7=19\n19-5=13\n13+3=16\n#### 16", CHAIN) == [(7, 1.0), (15, 0.0), (23, 0.0), (31, 0.0)]
    assert check(" 12 + 7 = 19 \n\n#### 17\nextra", CHAIN) == [(12, 1.0), (22, 1.0), (28, 0.0)]  # blank line skipped
    assert check("12+7=19\n19-5=14\n", CHAIN) == [(7, 1.0), (15, 1.0), (16, 0.0)]  # the missing answer: a step
    assert check("12+7=19\n19-5=14", CHAIN) == [(7, 1.0), (15, 0.0)]  # ... or the last line when it ends the text
    assert check("", CHAIN) == [(0, 0.0)]
    assert check("hello\n#### 17", CHAIN) == [(5, 0.0), (13, 1.0)]
    scaled = REWARDS.build("chain_steps", {"correct": 2.0, "wrong": -1.0})
    assert scaled("7+1=8\n#### 5", CHAIN) == [(5, -1.0), (12, -1.0)]
    with pytest.raises(ValueError, match="correct"):
        REWARDS.build("chain_steps", {"correct": math.inf})
    # answer: the reward of a right #### line only; a wrong one still gets `wrong`
    weighted = REWARDS.build("chain_steps", {"answer": 3.0})
    assert weighted("12+7=19\n19-5=14\n14+3=17\n#### 17", CHAIN) == [(7, 1.0), (15, 1.0), (23, 1.0), (31, 3.0)]
    assert weighted("12+7=19\n#### 16", CHAIN) == [(7, 1.0), (15, 0.0)]
    with pytest.raises(ValueError, match="answer"):
        REWARDS.build("chain_steps", {"answer": math.nan})
    # from a recipe: an optional number, null meaning `correct`
    cfg = load_config(None, ["reward.fns=[{name: chain_steps, answer: 3}, "
                             "{name: chain_steps, answer: null, label: plain}]"])
    assert [t.params for t in cfg.reward.fns] == [(("answer", 3.0),), (("answer", None),)]
    with pytest.raises(ConfigError, match=r"reward.fns\[0\].answer: must be a number"):
        load_config(None, ["reward.fns=[{name: chain_steps, answer: many}]"])


# ----------------------------------------------------------------------------- the step-level interface


@step_level
def _bad_steps(completion, sample):
    return {"decreasing": [(3, 1.0), (2, 1.0)], "past the end": [(99, 1.0)], "nan": [(1, math.nan)],
            "text": "steps", "none ok": [(1, None), (2, 1.0)]}[sample["case"]]


def test_score_batch_collects_steps_and_rejects_bad_ones():
    got = score_batch(["12+7=19\n#### 17", ""], [CHAIN, CHAIN], ["chain_steps", "final_answer"], [1.0, 0.5])
    assert got.steps == {"chain_steps": [[(7, 1.0), (15, 1.0)], [(0, 0.0)]]}
    assert got.per_fn["chain_steps"] == [1.0, 0.0]  # the per-sample value: mean scorable step reward
    assert got.total == [1.5, 0.0]
    cases = ["decreasing", "past the end", "nan", "text", "none ok"]
    bad = score_batch(["abcdef"] * 5, [{"case": c} for c in cases], [("bad", _bad_steps)], [1.0])
    assert bad.errors == {"bad": 4}
    assert bad.steps["bad"] == [[], [], [], [], [(1, None), (2, 1.0)]]
    assert bad.per_fn["bad"] == [None, None, None, None, 1.0]


def _bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(["12+7=19\n19-5=14\n14+3=17\n#### 17", "héllo wörld 12+7=19"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>")


def _naive_positions(tok, ids, ends):
    text = tok.decode(ids, skip_special_tokens=True)
    out = []
    for e in ends:
        if e >= len(text):
            out.append(len(ids) - 1)
        else:
            out.append(next(k for k in range(len(ids)) if len(tok.decode(ids[:k + 1], skip_special_tokens=True)) >= e))
    return out


@pytest.mark.parametrize("make", [build_tokenizer, _bpe], ids=["char", "bpe"])
def test_step_end_positions(make):
    tok = make()
    text = "12+7=19\n19-5=14\n14+3=17\n#### 17" + (" é" if make is _bpe else "")  # é: two bytes, split by BPE
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ends = [0, 1, 7, 8, 15, 23, len(text) - 1, len(text)]  # increasing, as checked_steps demands
    got = step_end_positions(tok, ids, ends)
    assert got == _naive_positions(tok, ids, ends)
    assert got[-1] == len(ids) - 1  # the step that ends the text lands on the eos
    for e, k in [(e, k) for e, k in zip(ends, got) if 0 < e < len(text)]:  # the token holds the step's last char
        assert len(tok.decode(ids[:k], skip_special_tokens=True)) < e <= len(tok.decode(ids[:k + 1]))
    if make is build_tokenizer:
        assert got == [0, 0, 6, 7, 14, 22, 29, 31]  # 31 = len(text): the eos


def test_step_tensors_hand():
    tok = build_tokenizer()
    texts = ["1+2=3\n#### 3", "#### 4"]
    rows = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    T = 15
    ids = torch.full((2, T), tok.pad_token_id)
    mask = torch.zeros(2, T, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, :len(r)], mask[b, :len(r)] = torch.tensor(r), 1
    steps = {"a": [[(5, 1.0), (12, 0.0)], [(6, None)]], "b": [[(12, 1.0)], []], "off": [[(1, 5.0)], [(1, 5.0)]]}
    rewards, smask = step_tensors(tok, ids, mask, steps, {"a": 1.0, "b": 0.5, "off": 0.0})
    assert smask[0].nonzero().flatten().tolist() == [4, 12] and smask[1].nonzero().flatten().tolist() == [6]
    assert rewards[0, 4] == 1.0 and rewards[0, 12] == 0.5  # a's 0 and b's 0.5 on the same (eos) token
    assert math.isnan(rewards[1, 6]) and rewards[smask == 0].abs().sum() == 0
    m = step_metrics([(rewards, smask)])
    assert m == {"process/steps_per_sample": 1.5, "process/step_reward/mean": 0.75,
                 "process/unscorable_step_frac": pytest.approx(1 / 3)}


# ----------------------------------------------------------------------------- configuration and the RL loop


def test_config_checks_name_the_key():
    with pytest.raises(ConfigError, match=r"reward.fns: .*final_answer, format_final would be ignored"):
        load_config(None, ["algo.advantage=process"])
    with pytest.raises(ConfigError, match="reward.fns: .*none with a non-zero weight"):
        load_config(None, ["algo.advantage=process", "reward.fns=[chain_steps]", "reward.weights=[0.0]"])
    with pytest.raises(ConfigError, match="algo.kl_in"):
        load_config(None, [*PROCESS, "algo.kl_in=reward", "algo.kl_coef=0.1"])
    with pytest.raises(ConfigError, match="algo.overlong_buffer_frac"):
        load_config(None, [*PROCESS, "algo.overlong_buffer_frac=0.2"])
    with pytest.raises(ConfigError, match="algo.policy_loss"):  # token-varying advantage: no sequence-level ratio
        load_config(None, [*PROCESS, "algo.policy_loss=gspo"])
    cfg = load_config(None, [*PROCESS, "reward.fns=[chain_steps,final_answer]", "reward.weights=[1.0,0.0]"])
    assert cfg.algo.advantage == "process"


def test_rl_run_with_process_supervision(tmp_path, tiny_overrides):
    from rlft.stages.pipeline import run_pipeline

    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=ps", *PROCESS, "rollout.max_new_tokens=12",
                                           "algo.group_size=4"))
    run_pipeline(cfg, echo=lambda *a: None)
    records = [json.loads(x) for x in (tmp_path / "ps" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3
    for r in records:
        assert r["process/steps_per_sample"] >= 1 and r["reward/chain_steps/errors"] == 0
        assert {"process/step_reward/mean", "reward/chain_steps/mean", "actor/pg_loss"} <= set(r)


def test_compute_advantages_uses_the_step_tensors(tmp_path, tiny_overrides, tiny_model_dir):
    from rlft.models.loading import load_model
    from rlft.rollout.batch import Batch
    from rlft.trainers.state import PromptSampler, RLState
    from rlft.trainers.rl import attach_steps, compute_advantages, score

    tok = build_tokenizer()
    cfg = load_config(None, tiny_overrides(tmp_path, *PROCESS, "algo.group_size=2"))
    texts = ["12+7=19\n19-5=14\n14+3=17\n#### 17", "12+7=19\n19-5=13\n#### 13"]
    rows = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    T = max(map(len, rows))
    ids, mask = torch.full((2, T), tok.pad_token_id), torch.zeros(2, T, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, :len(r)], mask[b, :len(r)] = torch.tensor(r), 1
    prompt = torch.ones(2, 3, dtype=torch.long)
    batch = Batch(prompt, prompt, ids, mask, torch.zeros(2, dtype=torch.bool), 2, texts=texts)
    from rlft.data.schema import Example
    ex = Example(prompt=CHAIN["prompt"], ground_truth="17")
    scored = score(batch, [ex], cfg)
    attach_steps(batch, scored, tok, cfg)
    model = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    state = RLState(model, tok, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), PromptSampler(1, 0),
                    [ex], [[1, 2, 3]])
    compute_advantages(state, batch, cfg)
    # steps: row 0 four right (the last on its eos); row 1 right, wrong, wrong #### line (on its eos)
    assert batch.step_mask[0].nonzero().flatten().tolist() == [6, 14, 22, 31]
    assert batch.step_mask[1].nonzero().flatten().tolist() == [6, 14, 23]
    assert batch.step_rewards[0].sum() == 4 and batch.step_rewards[1].sum() == 1
    want = process_advantages(batch.step_rewards, batch.step_mask, mask, 2, cfg.algo.adv_eps)
    torch.testing.assert_close(batch.adv, want)
    torch.testing.assert_close(batch.ret, want)
    assert batch.adv[0, 0] > batch.adv[0, 8] > 0 > batch.adv[1, 0]  # sums over the steps still ahead
    assert (batch.adv[mask == 0] == 0).all()


def test_process_demo_recipe_runs_at_tiny_size(tmp_path, tiny_size_overrides, recipes_dir):
    """recipes/process_demo.yaml as written, only smaller: [sft, rl], each entry with held-out exact_match."""
    from conftest import AS_USERS_RUN, assert_one_house
    from rlft.stages.pipeline import run_pipeline

    cfg = load_config(recipes_dir / "process_demo.yaml",
                      tiny_size_overrides(tmp_path, "log.name=p", "data.synth_train_size=24", "train.steps=2",
                                          "eval.ks=[1]", "rollout.max_new_tokens=12", *AS_USERS_RUN))
    assert cfg.algo.advantage == "process" and cfg.data.source == "synthetic:chain"
    entries = run_pipeline(cfg, echo=lambda *a: None).stages
    assert_one_house(tmp_path / "p")
    assert [e["stage"] for e in entries] == ["sft", "rl"]
    assert all("exact_match" in e["metrics"] for e in entries)
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())["stages"]
    assert summary == entries
    records = [json.loads(x) for x in (tmp_path / "p" / "1-rl" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all("process/steps_per_sample" in r for r in records)
