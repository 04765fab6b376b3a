"""Issue 33's workloads at real vocabulary sizes: benchmarks/make_tokenizer.py (a byte-level BPE tokenizer trained on
../shared/data) and benchmarks/make_model.py's presets (Qwen2-0.5B and Llama 3 shapes at CPU depth).

Fast: the tokenizer is trained on a few synthetic records at a vocabulary of 300; the presets' full-width configs are
checked on the meta device (no memory); the models actually written have the presets' vocabularies at a width of 28.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mt = _load("make_tokenizer")
mm = _load("make_model")

WORDS = ("apples", "oranges", "Natalia", "sold", "clips", "friends", "half", "many", "total", "each", "costs",
         "dollars", "function", "return", "list", "minimum", "triangle", "area", "probability", "integer")


def _write_jsonl(path: Path, records) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _data(root: Path, skip: tuple[str, ...] = ()) -> Path:
    """A synthetic ../shared/data: the files make_tokenizer.py reads, in their layout and with their fields."""
    def sentence(i: int) -> str:
        return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(6 + i % 5)) + f" {i * 37}."

    files = {
        "gsm8k/train.jsonl": [{"question": f"In 2024, {sentence(i)} (x+{i})", "answer": f"{sentence(i + 1)}\n<<{i}*2={2 * i}>>\n#### {2 * i}"}
                              for i in range(30)],
        "gsm8k/test.jsonl": [{"question": sentence(i + 50), "answer": f"#### {i}"} for i in range(10)],
        "math500/test.jsonl": [{"problem": f"Find $x^{i}$ if {sentence(i)}", "solution": f"$\\boxed{{{i}}}$",
                                "answer": str(i), "subject": "Algebra", "level": 1, "unique_id": f"test/{i}.json"}
                               for i in range(10)],
        "mbpp/mbpp.jsonl": [{"text": f"Write a function to {sentence(i)}", "task_id": i, "test_setup_code": "",
                             "code": f"def f{i}(x):\r\n    return x + {i}", "test_list": [f"assert f{i}(1) == {i + 1}"],
                             "challenge_test_list": []} for i in range(10)],
    }
    for rel, records in files.items():
        if rel not in skip:
            _write_jsonl(root / rel, records)
    return root


ROUND_TRIP = ("In 2024, (x+1) apples. Natalia sold 48 clips in April, and then she sold half as many clips in May.\n#### 72",
              "def min_cost(cost, m, n):\n\treturn [[0] * (n + 1)]  # unseen: é ’ 😀 \\frac{1}{2}",
              "  leading spaces, trailing ones  \n\n")


def test_make_tokenizer_round_trips_renders_chat_and_is_byte_identical_when_built_twice(tmp_path):
    data = _data(tmp_path / "data")
    tok = mt.build(tmp_path / "a", data, vocab_size=300)
    mt.build(tmp_path / "b", data, vocab_size=300)
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()

    from transformers import AutoTokenizer
    loaded = AutoTokenizer.from_pretrained(tmp_path / "a")
    assert len(loaded) == len(tok) == 300
    assert [loaded.pad_token, loaded.bos_token, loaded.eos_token] == ["<|endoftext|>", "<|begin_of_text|>", "<|im_end|>"]
    assert [loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id] == [0, 1, 2]
    for text in ROUND_TRIP:
        ids = loaded(text, add_special_tokens=False)["input_ids"]
        assert loaded.decode(ids) == text
        assert loaded(text)["input_ids"] == ids  # no bos or eos added by encoding
    assert len(loaded("Natalia sold apples", add_special_tokens=False)["input_ids"]) < len("Natalia sold apples")  # merged
    assert loaded.convert_ids_to_tokens(loaded("In 2024", add_special_tokens=False)["input_ids"])[-5:] == \
        ["Ġ", "2", "0", "2", "4"]  # digits one by one, as Qwen2's pre-tokenizer splits them

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    text = loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert loaded.apply_chat_template(messages, tokenize=False) == text[: -len("<|im_start|>assistant\n")]
    ids = loaded(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == loaded.convert_tokens_to_ids("<|im_start|>") == 3
    assert ids.count(loaded.eos_token_id) == 2 and loaded.decode(ids) == text


def test_make_tokenizer_skips_a_missing_file_by_name_and_refuses_an_empty_directory(tmp_path, capsys):
    data = _data(tmp_path / "data", skip=("mbpp/mbpp.jsonl",))
    assert len(mt.build(tmp_path / "tok", data, vocab_size=280)) == 280
    err = capsys.readouterr().err
    assert f"skipping {data / 'mbpp' / 'mbpp.jsonl'}: no such file" in err and "gsm8k" not in err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="gsm8k/train.jsonl"):
        mt.build(tmp_path / "none", tmp_path / "empty", vocab_size=280)
    with pytest.raises(ValueError, match="at least 260"):
        mt.train_tokenizer(["a b"], vocab_size=100)


def _rope_theta(cfg) -> float:
    return (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", None))


@pytest.mark.parametrize("layers", [2, 4])
def test_qwen2_preset_has_qwen2_05b_shape(layers):
    from transformers import AutoModelForCausalLM

    cfg = mm.preset_config("qwen2-0.5b", layers=layers)
    assert cfg.model_type == "qwen2"
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size,
            cfg.vocab_size, cfg.num_hidden_layers) == (896, 14, 2, 4864, 151936, layers)
    assert cfg.tie_word_embeddings is True and _rope_theta(cfg) == 1e6
    assert (cfg.max_position_embeddings, cfg.rms_norm_eps, cfg.hidden_act) == (131072, 1e-6, "silu")
    with torch.device("meta"):  # the full shape, no memory
        model = AutoModelForCausalLM.from_config(cfg)
    total, vocab = mm.parameter_counts(model)
    assert vocab == 151936 * 896 and model.model.layers[0].self_attn.q_proj.bias is not None
    assert total == {2: 165_960_320, 4: 195_785_088}[layers]  # the "166M parameters" at 2 layers
    assert mm.preset_config("qwen2-0.5b").num_hidden_layers == 2


def test_llama3_preset_has_llama3_shape_with_an_untied_head():
    from transformers import AutoModelForCausalLM

    cfg = mm.preset_config("llama3")
    assert cfg.model_type == "llama"
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size,
            cfg.vocab_size, cfg.num_hidden_layers, cfg.head_dim) == (2048, 32, 8, 8192, 128256, 1, 64)
    assert cfg.tie_word_embeddings is False and _rope_theta(cfg) == 500000.0
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    total, vocab = mm.parameter_counts(model)
    assert vocab == 2 * 128256 * 2048 and total == 586_160_128


def test_preset_overrides_and_refusals():
    cfg = mm.preset_config("llama3", layers=3, hidden_size=64, num_attention_heads=8, num_key_value_heads=2)
    assert (cfg.hidden_size, cfg.head_dim, cfg.num_key_value_heads, cfg.vocab_size, cfg.num_hidden_layers) == \
        (64, 8, 2, 128256, 3)
    with pytest.raises(ValueError, match="unknown preset"):
        mm.preset_config("gpt5")
    with pytest.raises(ValueError, match="do not divide"):
        mm.preset_config("qwen2-0.5b", hidden_size=100)

    class Big:
        def __len__(self):
            return 200_000
    with pytest.raises(ValueError, match="more than the model's 151936 embedding rows"):
        mm.preset_config("qwen2-0.5b", tokenizer=Big())


@pytest.mark.parametrize("preset", ["qwen2-0.5b", "llama3"])
def test_preset_model_directory_loads_with_the_tokenizer_as_built(tmp_path, preset):
    """The preset's vocabulary at width 28: the rows beyond the tokenizer's exist; AutoTokenizer on the model directory
    gives the tokenizer's own ids (transformers 5 rebuilds a qwen2 directory's tokenizer as a Qwen2Tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok_dir = tmp_path / "tok"
    mt.build(tok_dir, _data(tmp_path / "data"), vocab_size=300)
    model = mm.build_preset_model(tmp_path / "m", preset, tok_dir, layers=1, hidden_size=28, num_attention_heads=14
                                  if preset == "qwen2-0.5b" else 2, num_key_value_heads=2, intermediate_size=32)
    assert (tmp_path / "m" / "tokenizer.json").read_bytes() == (tok_dir / "tokenizer.json").read_bytes()
    direct, via_model = AutoTokenizer.from_pretrained(tok_dir), AutoTokenizer.from_pretrained(tmp_path / "m")
    for text in ROUND_TRIP + ("<|im_start|>user\nhi<|im_end|>\n",):
        assert via_model(text)["input_ids"] == direct(text)["input_ids"]
    assert via_model.chat_template == direct.chat_template and via_model.eos_token_id == direct.eos_token_id

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    vocab = {"qwen2-0.5b": 151936, "llama3": 128256}[preset]
    assert loaded.get_input_embeddings().weight.shape == (vocab, 28) and loaded.config.vocab_size == vocab
    assert (loaded.lm_head.weight is loaded.get_input_embeddings().weight) == (preset == "qwen2-0.5b")
    assert (loaded.config.bos_token_id, loaded.config.eos_token_id, loaded.config.pad_token_id) == (1, 2, 0)
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    ids = direct(ROUND_TRIP[0], return_tensors="pt")["input_ids"]
    assert loaded(ids).logits.shape == (1, ids.shape[1], vocab)


def test_make_model_cli_keeps_the_char_model_and_wants_a_tokenizer_with_a_preset(tmp_path, capsys):
    mm.main(["--out", str(tmp_path / "m"), "--hidden", "16", "--layers", "1", "--heads", "2"])
    out = capsys.readouterr().out
    assert out.splitlines()[0] == str(tmp_path / "m") and "parameters" in out
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (cfg["model_type"], cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]) == \
        ("llama", 16, 1, 48)
    with pytest.raises(SystemExit):
        mm.main(["--out", str(tmp_path / "p"), "--preset", "qwen2-0.5b"])
    assert "--preset needs --tokenizer" in capsys.readouterr().err


@pytest.mark.skipif(not (SHARED_DATA / "gsm8k" / "train.jsonl").is_file(),
                    reason=f"{SHARED_DATA} (the shared GSM8K, MATH-500 and MBPP files) is absent")
def test_the_shared_data_is_read_in_order():
    present, missing = mt.corpus_files(SHARED_DATA)
    names = [str(p.relative_to(SHARED_DATA)) for p, _ in present] + [str(p) for p in missing]
    assert names == [rel for rel, _ in mt.SOURCES]
    first = json.loads((SHARED_DATA / "gsm8k" / "train.jsonl").open(encoding="utf-8").readline())
    texts = mt.iter_texts(present)
    assert next(texts) == first["question"] and next(texts) == first["answer"]
    mbpp = next(mt.iter_texts([(SHARED_DATA / "mbpp" / "mbpp.jsonl", ("code",))]))
    assert "\r" not in mbpp and mbpp.startswith("R = 3")
