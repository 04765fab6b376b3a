"""``rlft merge``: (1 - alpha) A + alpha B of two tiny models built by ``from_config`` and ``save_pretrained``, read
back through rlft's own loading code (``rlft.models.loading``); every check that refuses a pair names what differs,
and a refused or failed merge leaves nothing under ``--out``."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlft.cli.main import main
from rlft.config import ConfigError
from rlft.models.loading import load_model, load_policy, load_tokenizer
from rlft.runs.merge import first_difference, interpolate, merge_models
from rlft.models.tiny import build_tokenizer
from rlft.recipe import load_config


def _save_model(path, seed: int, *, hidden: int = 32, dtype=torch.float32, tokenizer=None):
    """A tiny Llama from its config (weights drawn with ``seed``) and the character tokenizer, saved."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    tok = tokenizer or build_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    with torch.no_grad():  # RMSNorm weights start at 1 in both: move them so that every tensor differs
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture
def pair(tmp_path):
    return _save_model(tmp_path / "a", seed=1), _save_model(tmp_path / "b", seed=2)


def _weights(path) -> dict[str, torch.Tensor]:
    return dict(load_model(str(path)).named_parameters())


def _no_leftovers(out) -> bool:
    return not out.exists() and not list(out.parent.glob(f".tmp_{out.name}*"))


def test_interpolate_hand_case_and_endpoints():
    a, b = torch.tensor([0.0, 2.0, -1.0]), torch.tensor([1.0, 4.0, 3.0])
    assert torch.equal(interpolate(a, b, 0.25), torch.tensor([0.25, 2.5, 0.0]))  # 0.75 a + 0.25 b
    assert torch.equal(interpolate(a, b, 0.0), a) and torch.equal(interpolate(a, b, 1.0), b)
    half = interpolate(a.to(torch.bfloat16), b.to(torch.bfloat16), 0.5)
    assert half.dtype == torch.bfloat16 and torch.equal(half, torch.tensor([0.5, 3.0, 1.0], dtype=torch.bfloat16))
    ints = torch.tensor([1, 2])
    assert torch.equal(interpolate(ints, ints.clone(), 0.3), ints)
    with pytest.raises(ConfigError, match="'step' .* holds no weights to interpolate and differs"):
        interpolate(ints, torch.tensor([1, 3]), 0.3, "step")


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_merged_weights_are_the_interpolation_loaded_through_rlft(pair, tmp_path, alpha):
    a, b = pair
    out = merge_models(a, b, alpha, tmp_path / "merged")
    got, wa, wb = _weights(out), _weights(a), _weights(b)
    assert got.keys() == wa.keys() and len(got) > 5
    for name, p in got.items():  # naive: each entry in float64; rlft's float32 arithmetic rounds four times (alpha,
        # 1 - alpha, two products and a sum: at most 4 u32 of the terms' magnitudes)
        ta, tb = wa[name].double(), wb[name].double()
        want, scale = (1 - alpha) * ta + alpha * tb, (1 - alpha) * ta.abs() + alpha * tb.abs()
        assert p.dtype == torch.float32
        assert ((p.double() - want).abs() <= 4 * 2**-24 * scale).all(), name
        if alpha in (0.0, 1.0):  # the endpoints are the models themselves, exactly
            assert torch.equal(p, (wa if alpha == 0.0 else wb)[name]), name
    assert not torch.equal(got["model.norm.weight"], wa["model.norm.weight"]) or alpha == 0.0
    meta = json.loads((out / "merge.json").read_text())
    assert meta["alpha"] == alpha and meta["a"] == str(a.resolve()) and meta["b"] == str(b.resolve())
    model, tok = load_policy(str(out), load_config(None, ["model.device=cpu"]).model)  # as rlft eval / stages load it
    assert tok.get_vocab() == load_tokenizer(str(a)).get_vocab() and model.config.tie_word_embeddings
    assert torch.equal(model.get_output_embeddings().weight, model.get_input_embeddings().weight)  # still tied


def test_bfloat16_models_merge_in_their_dtype(tmp_path):
    a = _save_model(tmp_path / "a", 1, dtype=torch.bfloat16)
    b = _save_model(tmp_path / "b", 2, dtype=torch.bfloat16)
    out = merge_models(a, b, 0.5, tmp_path / "m")
    raw = load_file(str(out / "model.safetensors"))
    ra, rb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert raw.keys() == ra.keys()
    for name, t in raw.items():
        assert t.dtype == torch.bfloat16
        assert torch.equal(t, (0.5 * ra[name].float() + 0.5 * rb[name].float()).to(torch.bfloat16)), name


def test_a_different_config_is_refused_naming_the_key(tmp_path):
    a, b = _save_model(tmp_path / "a", 1), _save_model(tmp_path / "b", 2, hidden=64)
    with pytest.raises(ConfigError, match=r"config.json differs at 'head_dim': A .* has 16, B .* has 32"):
        merge_models(a, b, 0.5, tmp_path / "m")  # the first differing key in sorted order
    b = _save_model(tmp_path / "b2", 2)
    config = json.loads((b / "config.json").read_text())
    config["rms_norm_eps"], config["_name_or_path"] = 0.125, "elsewhere"  # the name is not architecture
    (b / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"config.json differs at 'rms_norm_eps': A .* has 1e-06, B .* has 0.125"):
        merge_models(a, b, 0.5, tmp_path / "m")
    assert _no_leftovers(tmp_path / "m")
    assert first_difference({"rope": {"theta": 1, "type": "x"}}, {"rope": {"theta": 2}}) == ("rope.theta", 1, 2)


def test_a_different_tensor_is_refused_naming_it(pair, tmp_path):
    a, b = pair
    weights = load_file(str(b / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"].to(torch.float16)
    save_file(weights, str(b / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"tensor 'model.norm.weight' differs: A has shape \(32,\) torch.float32, "
                                          r"B has \(32,\) torch.float16"):
        merge_models(a, b, 0.5, tmp_path / "m")
    weights["model.norm.weight"] = weights["model.norm.weight"][:16].float().contiguous()
    save_file(weights, str(b / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"tensor 'model.norm.weight' differs: A has shape \(32,\)"):
        merge_models(a, b, 0.5, tmp_path / "m")
    del weights["model.norm.weight"]
    save_file(weights, str(b / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"tensor 'model.norm.weight' is only in A"):
        merge_models(a, b, 0.5, tmp_path / "m")
    assert _no_leftovers(tmp_path / "m")


def test_a_different_tokenizer_is_refused(tmp_path):
    other = build_tokenizer()
    other.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    a, b = _save_model(tmp_path / "a", 1), _save_model(tmp_path / "b", 2, tokenizer=other)
    with pytest.raises(ConfigError, match=r"tokenizers of A .* and B .* differ in their chat template"):
        merge_models(a, b, 0.5, tmp_path / "m")
    (b / "tokenizer.json").unlink()
    (b / "tokenizer_config.json").unlink()
    # transformers may refuse the directory or build a default tokenizer for its model type: refused either way
    with pytest.raises(ConfigError, match=r"B: .*: no usable tokenizer|tokenizers of A .* differ in their vocabulary"):
        merge_models(a, b, 0.5, tmp_path / "m")
    assert _no_leftovers(tmp_path / "m")


def test_bad_arguments_and_directories_are_refused(pair, tmp_path):
    a, b = pair
    for alpha in (-0.1, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="--alpha must be a number in \\[0, 1\\]"):
            merge_models(a, b, alpha, tmp_path / "m")
    (tmp_path / "exists").mkdir()
    with pytest.raises(ConfigError, match="--out .*exists; give a new directory"):
        merge_models(a, b, 0.5, tmp_path / "exists")
    adapters = tmp_path / "adapters"
    adapters.mkdir()
    (adapters / "adapter_config.json").write_text("{}")
    with pytest.raises(ConfigError, match="B: .*adapters holds LoRA adapters"):
        merge_models(a, adapters, 0.5, tmp_path / "m")
    with pytest.raises(ConfigError, match="A: .*nowhere: no such directory"):
        merge_models(tmp_path / "nowhere", b, 0.5, tmp_path / "m")
    (b / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="holds no weights"):
        merge_models(a, b, 0.5, tmp_path / "m")
    assert _no_leftovers(tmp_path / "m")


def test_a_failed_write_leaves_nothing(pair, tmp_path, monkeypatch):
    import huggingface_hub

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(huggingface_hub, "save_torch_state_dict", full_disk)
    from rlft.errors import WriteFailed

    with pytest.raises(WriteFailed, match="No space left"):
        merge_models(*pair, 0.5, tmp_path / "m")
    assert _no_leftovers(tmp_path / "m")


def test_rlft_merge_command(pair, tmp_path, capsys):
    a, b = pair
    out = tmp_path / "merged"
    assert main(["merge", str(a), str(b), "--alpha", "0.5", "--out", str(out)]) == 0
    assert "(1 - 0.5)" in capsys.readouterr().out
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "merge.json"} <= names
    assert not any(n.endswith(".bin") for n in names)
    assert main(["merge", str(a), str(b), "--alpha", "2", "--out", str(tmp_path / "x")]) == 2
    assert "rlft: error: merge: --alpha must be a number in [0, 1]" in capsys.readouterr().err
