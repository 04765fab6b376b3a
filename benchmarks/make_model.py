"""Build a randomly initialised benchmark model (the embedded model's architecture and character tokenizer, or the
shape of a model people train with a tokenizer of make_tokenizer.py) in a directory.

    python benchmarks/make_model.py --out /tmp/m05 --hidden 128 --layers 2              # about 0.5M parameters
    python benchmarks/make_model.py --out /tmp/m34 --hidden 512 --layers 8 --mlp 2048   # about 34M parameters
    python benchmarks/make_tokenizer.py --out /tmp/tok32k
    python benchmarks/make_model.py --out /tmp/qwen2-l2 --preset qwen2-0.5b --layers 2 --tokenizer /tmp/tok32k  # 166M
    python benchmarks/make_model.py --out /tmp/qwen2-l4 --preset qwen2-0.5b --layers 4 --tokenizer /tmp/tok32k  # 196M
    python benchmarks/make_model.py --out /tmp/llama3-l1 --preset llama3 --layers 1 --tokenizer /tmp/tok32k     # 586M

Without ``--preset`` the architecture is Llama's (Qwen2's without the q/k/v biases): transformers 5 rebuilds the
tokenizer of a ``qwen2`` directory as byte-level BPE, which would drop the character vocabulary.

With ``--preset`` (``PRESETS``) the config is that model's, cut to ``--layers`` layers (default: the preset's CPU
depth), with the vocabulary of the real model: its embedding (and, untied, output) rows beyond the tokenizer's
vocabulary exist and are never produced by the tokenizer, as Qwen2's 151,936 rows hold 151,646 tokens. bos, eos and
pad ids are the tokenizer's. ``--hidden``/``--heads``/``--kv-heads``/``--mlp``/``--max-positions`` given
explicitly override the preset's (for tests: the preset's vocabulary with a small width). The weights are
``AutoModelForCausalLM.from_config``'s random initialisation under ``--seed``, saved in ``--dtype`` (float32 by
default, as rlft trains on CPU).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

#: Qwen2-0.5B's config.json (Qwen/Qwen2-0.5B): 24 layers at full depth, q/k/v biases (model type qwen2).
QWEN2_05B = dict(
    model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_attention_heads=14,
    num_key_value_heads=2, num_hidden_layers=24, tie_word_embeddings=True, rope_theta=1000000.0,
    max_position_embeddings=131072, rms_norm_eps=1e-6, hidden_act="silu", initializer_range=0.02,
    use_sliding_window=False, sliding_window=131072, max_window_layers=24, attention_dropout=0.0,
)

#: Llama 3's vocabulary and rope at Llama-3.2-1B's width (16 layers at full depth; head_dim 64, rope theta 500000
#: with the llama3 rope scaling), with the output layer untied from the embedding as in Llama 3 8B and 70B
#: (Llama-3.2-1B itself ties them): the 128,256 x 2048 head is a weight of its own, with its own gradient.
LLAMA3 = dict(
    model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
    num_key_value_heads=8, num_hidden_layers=16, head_dim=64, tie_word_embeddings=False, rope_theta=500000.0,
    rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192},
    max_position_embeddings=131072, rms_norm_eps=1e-5, hidden_act="silu", initializer_range=0.02,
    attention_bias=False, mlp_bias=False, attention_dropout=0.0,
)

#: name -> (config fields, default number of layers: the CPU depth issue 33's workloads use).
PRESETS = {"qwen2-0.5b": (QWEN2_05B, 2), "llama3": (LLAMA3, 1)}

#: --option -> config field it overrides in a preset.
OVERRIDES = {"hidden": "hidden_size", "heads": "num_attention_heads", "kv_heads": "num_key_value_heads",
             "mlp": "intermediate_size", "max_positions": "max_position_embeddings"}


#: The files of a tokenizer directory copied into the model's.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt")


def preset_config(name: str, *, layers: int | None = None, tokenizer=None, **overrides):
    """The transformers config of preset ``name`` with ``layers`` layers (default: the preset's CPU depth); bos, eos
    and pad ids from ``tokenizer`` when given; ``overrides``: config fields to change (``hidden_size``, ...); a
    width override without ``head_dim`` gets hidden / heads."""
    from transformers import AutoConfig

    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; one of {', '.join(PRESETS)}")
    fields, depth = PRESETS[name]
    fields = dict(fields, num_hidden_layers=layers or depth, **overrides)
    if "head_dim" in fields and {"hidden_size", "num_attention_heads"} & overrides.keys() and "head_dim" not in overrides:
        fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
    if fields["hidden_size"] % fields["num_attention_heads"] or fields["num_attention_heads"] % fields["num_key_value_heads"]:
        raise ValueError(f"{name}: hidden {fields['hidden_size']}, {fields['num_attention_heads']} heads and "
                         f"{fields['num_key_value_heads']} KV heads do not divide")
    if tokenizer is not None:
        if len(tokenizer) > fields["vocab_size"]:
            raise ValueError(f"{name}: the tokenizer has {len(tokenizer)} tokens, more than the model's "
                             f"{fields['vocab_size']} embedding rows")
        fields.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id)
    model_type = fields.pop("model_type")
    return AutoConfig.for_model(model_type, **fields)


def build_preset_model(out: str | Path, name: str, tokenizer_dir: str | Path, *, layers: int | None = None,
                       seed: int = 0, dtype: str = "float32", **overrides):
    """Write preset ``name``'s randomly initialised model and the tokenizer files of ``tokenizer_dir`` to ``out``;
    return the model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = preset_config(name, layers=layers, tokenizer=tok, **overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:  # the files as make_tokenizer.py wrote them, byte for byte
        if (Path(tokenizer_dir) / name).is_file():
            shutil.copyfile(Path(tokenizer_dir) / name, out / name)
    return model


def parameter_counts(model) -> tuple[int, int]:
    """(parameters, of which the input embedding's and, untied, the output layer's): each shared tensor once."""
    params = {id(p): p.numel() for p in model.parameters()}
    vocab = {id(p): p.numel() for p in (model.get_input_embeddings().weight, model.get_output_embeddings().weight)}
    return sum(params.values()), sum(vocab.values())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="a model shape people train (needs --tokenizer)")
    ap.add_argument("--tokenizer", help="tokenizer directory (benchmarks/make_tokenizer.py) saved with a preset model")
    ap.add_argument("--hidden", type=int, help="hidden size (default 128; a preset's own)")
    ap.add_argument("--layers", type=int, help="layers (default 2; a preset's CPU depth: qwen2-0.5b 2, llama3 1)")
    ap.add_argument("--heads", type=int, help="attention heads (default 4; a preset's own)")
    ap.add_argument("--kv-heads", type=int, help="key/value heads (a preset's own; without a preset: --heads)")
    ap.add_argument("--mlp", type=int, help="MLP width (default 3 x hidden; a preset's own)")
    ap.add_argument("--max-positions", type=int, help="maximum positions (default 2048; a preset's own)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="for --preset")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.preset:
        if not a.tokenizer:
            ap.error("--preset needs --tokenizer DIR (benchmarks/make_tokenizer.py --out DIR)")
        overrides = {field: getattr(a, opt) for opt, field in OVERRIDES.items() if getattr(a, opt) is not None}
        model = build_preset_model(a.out, a.preset, a.tokenizer, layers=a.layers, seed=a.seed, dtype=a.dtype,
                                   **overrides)
        total, vocab = parameter_counts(model)
        cfg = model.config
        print(a.out)
        depth = f"{cfg.num_hidden_layers} layer" + ("" if cfg.num_hidden_layers == 1 else "s")
        print(f"{a.preset}: {depth}, hidden {cfg.hidden_size}, vocabulary {cfg.vocab_size} "
              f"({'tied' if cfg.tie_word_embeddings else 'untied'}); {total:,} parameters ({total / 1e6:.1f}M), "
              f"{vocab:,} of them in the embedding{'' if cfg.tie_word_embeddings else ' and output layer'}")
        return
    if a.tokenizer:
        ap.error("--tokenizer goes with --preset; without one the model has the embedded character tokenizer")
    if a.kv_heads is not None and a.kv_heads != (a.heads or 4):
        ap.error("--kv-heads goes with --preset; without one every head has its own keys and values")
    if a.dtype != "float32":
        ap.error("--dtype goes with --preset")
    from rlft.models.tiny import build_tiny_model

    path = build_tiny_model(a.out, hidden_size=a.hidden or 128, layers=a.layers or 2, heads=a.heads or 4,
                            intermediate_size=a.mlp or 0, max_positions=a.max_positions or 2048, seed=a.seed)
    print(path)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):  # the shapes only: count without loading the weights again
        total, vocab = parameter_counts(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)))
    print(f"{total:,} parameters ({total / 1e6:.1f}M), {vocab:,} of them in the embedding")


if __name__ == "__main__":
    main()
