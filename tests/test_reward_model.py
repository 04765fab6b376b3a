"""``reward_model``: a one-label sequence classifier's score, equal to a naive per-text forward pass.

The checkpoints are tiny Llama classifiers built from a config with the embedded
character tokenizer and saved with save_pretrained (no download).
"""

from __future__ import annotations

import json
import math
import pickle

import pytest
import torch

from rlft.rewards.terms import built
from rlft.recipe import load_config
from rlft.config import ConfigError
from rlft.models.tiny import build_tokenizer
from rlft.rewards import REWARDS, is_batched, score_batch
from rlft.rewards import model as rm

TOL = 1e-5
CHAT = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"})
COMPLETIONS = ["5", "It is 5.", "#### 6", "", "a much longer answer: 2 + 3 = 5, so 5", "x", "five"]
SAMPLES = [{"prompt": "Q: 2+3?\nA: "}, {"prompt": CHAT}, {"prompt": "Q: 2+3?\nA: "}, {"prompt": CHAT},
           {"prompt": CHAT}, {"prompt": ""}, {"prompt": "Add 2 and 3. "}]


def save_classifier(out, *, num_labels: int = 1, with_pad: bool = True, seed: int = 0):
    """A tiny LlamaForSequenceClassification and its tokenizer in ``out``; returns the path as a string."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = build_tokenizer()
    if not with_pad:  # like many base-model tokenizers: no pad token, and none in the config
        tok.pad_token = None
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=0.2, num_labels=num_labels, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id if with_pad else None)
    torch.manual_seed(seed)
    LlamaForSequenceClassification(config).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    """A one-label tiny classifier shared by the module's tests."""
    return save_classifier(tmp_path_factory.mktemp("rm"))


def naive_scores(path: str, completions, samples, max_length: int = 10_000) -> list[float | None]:
    """One forward pass per text, no padding, on a freshly loaded model: the reference.

    The pad id (the tokenizer's, else eos) is set in the config as for any batched use: transformers'
    classifiers read the last token that is not the pad id, so with pad == eos a trailing eos is skipped.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    model.config.pad_token_id = tok.eos_token_id if tok.pad_token_id is None else tok.pad_token_id  # HF pooling
    out = []
    for completion, sample in zip(completions, samples):
        prompt = sample["prompt"]
        if isinstance(prompt, tuple):
            text = tok.apply_chat_template([*prompt, {"role": "assistant", "content": completion}], tokenize=False)
            ids = tok(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tok(prompt + completion)["input_ids"]
        ids = ids[-max_length:]
        if not ids:
            out.append(None)
            continue
        with torch.no_grad():
            out.append(model(input_ids=torch.tensor([ids])).logits[0, 0].item())
    return out


def assert_close(got, want):
    """Equal within TOL, None where the other is None."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g is None and w is None) or math.isclose(g, w, rel_tol=TOL, abs_tol=TOL), (got, want)


def test_scores_equal_a_naive_loop(rm_dir):
    """Chunks of 3, plain and chat prompts: the same scores as one unpadded forward per text."""
    fn = REWARDS.build("reward_model", {"path": rm_dir, "batch_size": 3, "device": "cpu"})
    assert is_batched(fn)
    want = naive_scores(rm_dir, COMPLETIONS, SAMPLES)
    assert len({round(w, 6) for w in want if w is not None}) > 3  # the texts really score differently
    assert_close(fn(COMPLETIONS, SAMPLES), want)
    got = score_batch(COMPLETIONS, SAMPLES, [("rm", fn)], [1.0], timeout_s=60.0)
    assert got.errors["rm"] == 0
    assert_close(got.per_fn["rm"], want)


def test_empty_text_is_unscorable(rm_dir):
    """Nothing to read: None, not a score of the pad token."""
    fn = REWARDS.build("reward_model", {"path": rm_dir})
    assert fn([""], [{"prompt": ""}]) == [None]


def test_padding_side_and_batch_composition_do_not_change_a_score(rm_dir):
    """Left/right pads, batch size 1 or 8, another order: the same scores."""
    right = REWARDS.build("reward_model", {"path": rm_dir, "batch_size": 8, "padding_side": "right"})
    left = REWARDS.build("reward_model", {"path": rm_dir, "batch_size": 8, "padding_side": "left"})
    alone = REWARDS.build("reward_model", {"path": rm_dir, "batch_size": 1})
    base = right(COMPLETIONS, SAMPLES)
    assert_close(left(COMPLETIONS, SAMPLES), base)
    assert_close(alone(COMPLETIONS, SAMPLES), base)
    order = [6, 2, 4, 0, 5, 1, 3]  # other neighbours, other chunk lengths
    assert_close(right([COMPLETIONS[i] for i in order], [SAMPLES[i] for i in order]), [base[i] for i in order])


def test_pooling_needs_the_pad_token_in_the_config(rm_dir):
    """The control: pooling at a wrong position (pad id unknown to the config) does change right-padded scores."""
    model, tok, _ = rm.load_reward_model(rm_dir, torch.device("cpu"), "float32")
    ids = [tok("short")["input_ids"], tok("a longer text here")["input_ids"]]
    good = rm.forward(model, ids, tok.pad_token_id, "right", True)
    model.config.pad_token_id = tok.unk_token_id  # never in these texts: the last (pad) position is pooled
    bad = rm.forward(model, ids, tok.pad_token_id, "right", True)
    assert abs(good[0] - bad[0]) > 1e-3 and abs(good[1] - bad[1]) < TOL


def test_a_tokenizer_without_pad_token_pads_with_eos(tmp_path):
    """No pad token anywhere: eos pads, and the config learns it."""
    path = save_classifier(tmp_path / "nopad", with_pad=False, seed=1)
    fn = REWARDS.build("reward_model", {"path": path, "batch_size": 4})
    assert_close(fn(COMPLETIONS, SAMPLES), naive_scores(path, COMPLETIONS, SAMPLES))
    model, tok, _ = rm.load_reward_model(path, torch.device("cpu"), "float32")
    assert tok.pad_token_id == tok.eos_token_id == model.config.pad_token_id


def test_scale_shift_and_truncation(rm_dir):
    """scale * score + shift; max_length keeps a text's last tokens."""
    raw = REWARDS.build("reward_model", {"path": rm_dir})(COMPLETIONS, SAMPLES)
    scaled = REWARDS.build("reward_model", {"path": rm_dir, "scale": -2.0, "shift": 0.5})(COMPLETIONS, SAMPLES)
    assert_close(scaled, [None if r is None else -2.0 * r + 0.5 for r in raw])
    short = REWARDS.build("reward_model", {"path": rm_dir, "max_length": 6})(COMPLETIONS, SAMPLES)
    assert_close(short, naive_scores(rm_dir, COMPLETIONS, SAMPLES, max_length=6))  # the last 6 tokens are kept


def test_weights_load_lazily_once_per_process(rm_dir, monkeypatch):
    """Building reads the config only; two entries share one loaded model."""
    calls = []
    real = rm.load_reward_model
    monkeypatch.setattr(rm, "_LOADED", {})
    monkeypatch.setattr(rm, "load_reward_model", lambda *a: calls.append(a) or real(*a))
    first = REWARDS.build("reward_model", {"path": rm_dir})
    second = REWARDS.build("reward_model", {"path": rm_dir, "batch_size": 2})
    assert calls == []  # construction reads the config only
    first(["a"], [{"prompt": ""}])
    second(["b"], [{"prompt": ""}])
    assert len(calls) == 1 and len(rm._LOADED) == 1
    REWARDS.build("reward_model", {"path": rm_dir, "dtype": "bfloat16"})(["c"], [{"prompt": ""}])
    assert len(calls) == 2  # another dtype is another model


def test_picklable_without_the_model(rm_dir):
    """The instance pickles as its parameters, even after loading."""
    fn = REWARDS.build("reward_model", {"path": rm_dir})
    fn(["warm"], [{"prompt": ""}])  # loaded into the cache, not into the instance
    blob = pickle.dumps(fn)
    assert len(blob) < 1000
    copy = pickle.loads(blob)
    assert copy == fn and copy(["5"], [SAMPLES[0]]) == fn(["5"], [SAMPLES[0]])


def test_bad_checkpoints_are_rejected_with_the_path(tmp_path):
    """Two labels, a missing directory, no config: a ValueError naming the path."""
    two = save_classifier(tmp_path / "two_labels", num_labels=2)
    with pytest.raises(ValueError, match=r"^path: the model in .*two_labels' has num_labels=2"):
        REWARDS.build("reward_model", {"path": two})
    with pytest.raises(ValueError, match=r"^path: '.*nowhere' is not a directory"):
        REWARDS.build("reward_model", {"path": str(tmp_path / "nowhere")})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"^path: no readable model config in '.*empty'"):
        REWARDS.build("reward_model", {"path": str(tmp_path / "empty")})
    with pytest.raises(KeyError, match="path: reward 'reward_model' needs this parameter"):
        REWARDS.get("reward_model")


@pytest.mark.parametrize("params, message", [
    ({"batch_size": 0}, "batch_size: must be >= 1"),
    ({"max_length": 0}, "max_length: must be >= 1"),
    ({"device": "tpu"}, "device: must be auto, cpu, cuda or cuda:N"),
    ({"scale": float("nan")}, "scale: must be a finite number"),
])
def test_bad_parameters(rm_dir, params, message):
    """Out-of-range parameters name their field."""
    with pytest.raises(ValueError, match=message):
        REWARDS.build("reward_model", {"path": rm_dir, **params})


def test_config_entry_is_checked_at_parse_time(rm_dir, tmp_path):
    """reward.fns entries build at parse time; errors name the entry's key."""
    cfg = load_config(None, [f"reward.fns=[{{name: reward_model, path: {rm_dir}}}]"])
    ((label, fn),) = built(cfg.reward)
    assert label == "reward_model" and fn.path == rm_dir and fn.device == "auto"
    two = save_classifier(tmp_path / "two", num_labels=2)
    with pytest.raises(ConfigError, match=r"reward\.fns\[0\]\.path: the model in .* has num_labels=2"):
        load_config(None, [f"reward.fns=[{{name: reward_model, path: {two}}}]"])
    with pytest.raises(ConfigError, match=r"reward\.fns\[0\]\.path: .* is not a directory"):
        load_config(None, [f"reward.fns=[{{name: reward_model, path: {tmp_path / 'missing'}}}]"])


@pytest.mark.gpu
def test_cuda_scores_match_cpu(rm_dir):
    """On a GPU the scores match the CPU ones (float32, loose tolerance)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    cpu = REWARDS.build("reward_model", {"path": rm_dir, "device": "cpu"})(COMPLETIONS, SAMPLES)
    gpu = REWARDS.build("reward_model", {"path": rm_dir, "device": "cuda", "batch_size": 3})(COMPLETIONS, SAMPLES)
    for g, c in zip(gpu, cpu):
        assert (g is None and c is None) or math.isclose(g, c, abs_tol=1e-3)


def test_a_run_trains_with_the_reward_model(tmp_path, rm_dir, tiny_overrides):
    """A few-step RL run scored by the reward model: finite metrics, no errors."""
    from rlft.stages.pipeline import run_pipeline

    entry = f"reward.fns=[{{name: reward_model, path: {rm_dir}}}]"
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=rm", entry, "reward.weights=[1.0]", "sft.steps=0",
                                           "train.steps=2"))
    run_dir = run_pipeline(cfg, echo=lambda *a, **k: None).run_dir
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for rec in records:
        assert rec["reward/reward_model/errors"] == 0.0 and "reward/reward_model/mean" in rec
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in rec.values())
