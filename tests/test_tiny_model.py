"""The embedded tiny model and character tokenizer, saved and loaded back like any Hugging Face model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlft.config import ConfigError
from rlft.models.loading import load_model, load_tokenizer, resolve_device
from rlft.models.tiny import CHARS, SPECIALS, build_tiny_model, build_tokenizer

ROUND_TRIP = [
    "hello world",
    "two  spaces and   three",
    " leading and trailing ",
    "para one\n\npara two\n",
    "tab\tseparated\tvalues",
    "0123456789 -42 +7 3.14 1,072",
    "punct: a . b , c ; d ! e ? (f) [g] {h} 'i' \"j\" #### 72",
    "max(12,7,99)=? Answer after ####.",
    "don't stop -- it's 50% off & more_ok ~`^|\\/<>@$*=",
]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir), AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def test_saved_directory_is_a_hf_model(tiny_model_dir):
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
        assert (tiny_model_dir / name).is_file(), name
    assert any(tiny_model_dir.glob("*.safetensors"))


def test_loads_back_with_auto_classes(loaded):
    tok, model = loaded
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tok) == len(SPECIALS) + len(CHARS)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    assert model.config.eos_token_id == tok.eos_token_id
    assert model.config.pad_token_id == tok.pad_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_tokenizer_round_trip(loaded, text):
    tok, _ = loaded
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == text


@pytest.mark.parametrize("text", ROUND_TRIP[:3])
def test_in_memory_tokenizer_matches_the_saved_one(loaded, text):
    tok, _ = loaded
    fresh = build_tokenizer()
    assert fresh(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]


def test_special_tokens(loaded):
    tok, _ = loaded
    ids = {tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id}
    assert None not in ids
    assert len(ids) == 4  # pad, eos, bos and unk are distinct
    assert tok.eos_token == "<eos>" and tok.pad_token == "<pad>"
    # eos is a single token that never comes from ordinary text
    assert tok("<eos>", add_special_tokens=False)["input_ids"] == [tok.eos_token_id]
    assert tok.decode([tok.eos_token_id, *tok("ab", add_special_tokens=False)["input_ids"]],
                      skip_special_tokens=True) == "ab"


def test_chat_template(loaded):
    tok, _ = loaded
    msgs = [{"role": "user", "content": "max(1,2,3)=?"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == "Q: max(1,2,3)=?\nA: "
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False) == "Q: max(1,2,3)=?\n"
    with_system = [{"role": "system", "content": "Be brief."}, *msgs, {"role": "assistant", "content": "3"}]
    assert tok.apply_chat_template(with_system, tokenize=False) == "Be brief.\nQ: max(1,2,3)=?\nA: 3<eos>"


def test_rlft_loading_code(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    assert tok.padding_side == "left"
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    model = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    assert next(model.parameters()).dtype == torch.float32
    assert next(model.parameters()).device.type == "cpu"
    bf16 = load_model(str(tiny_model_dir), dtype="bfloat16", device=resolve_device("cpu"))
    assert next(bf16.parameters()).dtype == torch.bfloat16
    eager = load_model(str(tiny_model_dir), attn_implementation="eager")
    assert eager.config._attn_implementation == "eager"


def test_load_tokenizer_without_pad_falls_back_to_eos(tiny_model_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    assert loaded.pad_token_id == loaded.eos_token_id


def test_resolve_device():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="model.device=cuda: .*(CPU build|no CUDA device)"):
            resolve_device("cuda")


def test_default_size_param_count(tmp_path):
    out = build_tiny_model(tmp_path / "m", hidden_size=128, layers=4, heads=4)
    model = AutoModelForCausalLM.from_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    assert 0.5e6 <= n <= 5e6, n


def test_build_is_seeded(tmp_path):
    a = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "a", hidden_size=32, layers=1, heads=2))
    b = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "b", hidden_size=32, layers=1, heads=2))
    c = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "c", hidden_size=32, layers=1, heads=2,
                                                              seed=1))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    # building does not consume the caller's random stream
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "d", hidden_size=32, layers=1, heads=2)
    assert torch.equal(torch.rand(3), expected)


def test_generation_runs(loaded):
    tok, model = loaded
    prompt = tok.apply_chat_template([{"role": "user", "content": "max(1,2,3)=?"}], tokenize=False,
                                     add_generation_prompt=True)
    enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
    torch.manual_seed(0)
    out = model.generate(**enc, max_new_tokens=6, do_sample=True, pad_token_id=tok.pad_token_id)
    assert out.shape[0] == 1
    assert enc["input_ids"].shape[1] < out.shape[1] <= enc["input_ids"].shape[1] + 6
    assert torch.equal(out[0, :enc["input_ids"].shape[1]], enc["input_ids"][0])
    text = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert isinstance(text, str)
    greedy = model.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    greedy2 = model.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    assert torch.equal(greedy, greedy2)
