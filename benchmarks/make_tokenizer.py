"""Train a byte-level BPE tokenizer on the text of ../shared/data and save it as a transformers tokenizer directory.

    python benchmarks/make_tokenizer.py --out /tmp/tok32k                       # vocabulary 32,000
    python benchmarks/make_tokenizer.py --out /tmp/tok8k --vocab-size 8000 --data ../shared/data

The text: GSM8K questions and worked solutions (train and test), MATH-500 problems and solutions, MBPP problem
statements, reference code and asserts (5.4M characters). A file that is absent is skipped with a message naming it
(the vocabulary may then come out smaller than asked: the line printed at the end says how many); no file at all
is an error. Nothing is downloaded.

The tokenizer: bytes as the base alphabet (any text encodes, nothing is unknown), BPE merges of every pair seen at
least once, most frequent first, up to ``--vocab-size`` entries (the special tokens and the 256 bytes included).
Its normaliser (NFC) and pre-tokenizer (words, single digits, punctuation runs, then bytes) are those transformers'
``Qwen2Tokenizer`` builds, taken from the installed transformers: transformers 5 rebuilds the tokenizer of a
``qwen2`` model directory as a ``Qwen2Tokenizer`` from this file's vocabulary and merges, whatever the directory's
``tokenizer_class`` says, so with any other pipeline the ``qwen2-0.5b`` model of make_model.py would load a
tokenizer that splits text differently from this one. With this one, ``AutoTokenizer`` gives the same ids from this
directory and from a model directory of either make_model.py preset. The text of ../shared/data allows about 33,000
entries under this pipeline. Saved through ``transformers.PreTrainedTokenizerFast`` with

- special tokens ``<|endoftext|>`` (pad), ``<|begin_of_text|>`` (bos, never added by encoding), ``<|im_end|>``
  (eos: the end of a chat turn, so sampling stops where an assistant turn ends) and ``<|im_start|>``, ids 0-3;
- a ChatML-style chat template: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, and
  ``<|im_start|>assistant\\n`` as the generation prompt.

Reproducible: the texts are read in a fixed order and the trainer's merges break ties by a fixed rule, so the same
data and vocabulary size give a byte-identical ``tokenizer.json`` (the tests build one twice and compare).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Iterator

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

PAD, BOS, EOS, IM_START = "<|endoftext|>", "<|begin_of_text|>", "<|im_end|>", "<|im_start|>"
SPECIALS = (PAD, BOS, EOS, IM_START)

# (file under the data directory, the text fields of each record), in the order they are read.
SOURCES = (
    ("gsm8k/train.jsonl", ("question", "answer")),
    ("gsm8k/test.jsonl", ("question", "answer")),
    ("math500/test.jsonl", ("problem", "solution")),
    ("mbpp/mbpp.jsonl", ("text", "code", "test_list")),
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    f"{IM_START}{{{{ message['role'] }}}}\n{{{{ message['content'] }}}}{EOS}\n"
    "{% endfor %}"
    f"{{% if add_generation_prompt %}}{IM_START}assistant\n{{% endif %}}"
)


def _field_text(value) -> str:
    if isinstance(value, list):  # MBPP's test_list: one assert per line
        return "\n".join(str(v) for v in value)
    return str(value).replace("\r\n", "\n")  # MBPP's code has Windows line endings


def corpus_files(data_dir: str | Path) -> tuple[list[tuple[Path, tuple[str, ...]]], list[Path]]:
    """The source files present under ``data_dir`` (with their fields) and the ones missing, in ``SOURCES`` order."""
    data_dir = Path(data_dir)
    present, missing = [], []
    for rel, fields in SOURCES:
        path = data_dir / rel
        if path.is_file():
            present.append((path, fields))
        else:
            missing.append(path)
    return present, missing


def iter_texts(files: list[tuple[Path, tuple[str, ...]]]) -> Iterator[str]:
    """Every non-empty text field of every record, file by file, record by record (a fixed order)."""
    for path, fields in files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                record = json.loads(line)
                for field in fields:
                    text = _field_text(record.get(field, ""))
                    if text:
                        yield text


def train_tokenizer(texts, vocab_size: int = 32000):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts`` (an iterable of strings)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

    if vocab_size < 256 + len(SPECIALS):
        raise ValueError(f"--vocab-size {vocab_size}: at least {256 + len(SPECIALS)} (the 256 bytes and "
                         f"{len(SPECIALS)} special tokens)")
    qwen2 = Qwen2Tokenizer().backend_tokenizer  # an empty one: only its normaliser and pre-tokenizer are used
    core = Tokenizer(models.BPE())
    core.normalizer = qwen2.normalizer
    core.pre_tokenizer = qwen2.pre_tokenizer
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, show_progress=False,
                                  special_tokens=list(SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                  additional_special_tokens=[IM_START], clean_up_tokenization_spaces=False)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build(out: str | Path, data_dir: str | Path = DEFAULT_DATA, vocab_size: int = 32000):
    """Train on the files of ``data_dir`` and save to ``out``; return the tokenizer."""
    present, missing = corpus_files(data_dir)
    for path in missing:
        print(f"make_tokenizer: skipping {path}: no such file", file=sys.stderr)
    if not present:
        raise SystemExit(f"make_tokenizer: none of {', '.join(rel for rel, _ in SOURCES)} under {data_dir}")
    tok = train_tokenizer(iter_texts(present), vocab_size)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    return tok


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory to write the tokenizer to")
    ap.add_argument("--vocab-size", type=int, default=32000, help="entries, special tokens and bytes included")
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="the shared data directory (gsm8k/, math500/, mbpp/)")
    a = ap.parse_args(argv)
    start = time.perf_counter()
    tok = build(a.out, a.data, a.vocab_size)
    seconds = time.perf_counter() - start
    files = ", ".join(str(p.relative_to(a.data)) for p, _ in corpus_files(a.data)[0])
    print(f"{a.out}: {len(tok)} tokens (asked {a.vocab_size}) from {files}; "
          f"{_dir_bytes(Path(a.out)) / 1e6:.2f} MB, {seconds:.1f} s")


if __name__ == "__main__":
    main()
