"""The embedded default model: a tiny Llama-style causal LM and a character tokenizer.

Both are built locally (no download), saved with ``save_pretrained`` and then
loaded back through ``AutoModelForCausalLM`` / ``AutoTokenizer`` like any real
model. A Llama-style config is used on purpose: transformers 5 rebuilds the
tokenizer of a ``qwen2`` directory as byte-level BPE, which would drop the
spaces and newlines of a character-level vocabulary.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
# Every printable ASCII character except the vertical whitespace we never emit.
CHARS = tuple(c for c in string.printable if c not in "\r\x0b\x0c")

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n"
    "{% elif m['role'] == 'user' %}Q: {{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}A: {{ m['content'] }}{{ eos_token }}"
    "{% elif m['role'] == 'tool' %}T: {{ m['content'] }}\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A: {% endif %}"
)


def build_tokenizer():
    """A character-level fast tokenizer with pad/bos/eos/unk and a chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_model(out_dir: str | Path, *, hidden_size: int = 128, layers: int = 4, heads: int = 4,
                     max_positions: int = 512, intermediate_size: int = 0, seed: int = 0) -> Path:
    """Write a randomly initialised tiny Llama and its tokenizer to ``out_dir``; return the path."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    tok = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 3 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
