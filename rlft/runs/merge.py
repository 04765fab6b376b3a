"""``rlft merge A B --alpha x --out DIR``: the linear interpolation (1 - alpha) A + alpha B of two models of one
architecture, tensor by tensor (long-to-short by weight merging: a long- and a short-reasoning model averaged, Kimi
k1.5 §2.4).

Everything is checked before anything is written, and the first mismatch is a ``ConfigError`` naming it:

- A and B are local directories of whole Hugging Face models (``config.json`` and weights: ``model.safetensors``,
  ``pytorch_model.bin`` or their sharded indexes); LoRA adapter or roles directories are refused (merge the adapters
  into their base first: ``lora.save=merged``);
- their ``config.json`` agree on every key but ``_name_or_path`` and ``transformers_version`` (the first differing
  key, dotted into nested sections, is named);
- the tensors: the same names in both, and each of the same shape and dtype (the first differing tensor is named);
  integer tensors (buffers) must be equal, being no weights to interpolate;
- their tokenizers (loaded by ``rlft.models.loading.load_tokenizer``) are equal: vocabulary, special tokens, chat
  template and the rest of the fast tokenizer's definition. The output's tokenizer is A's.

Floating tensors are interpolated in float32 (float64 stays float64) and cast back to their dtype, so alpha 0 gives
A's and alpha 1 B's tensors exactly. The output is A's directory with the merged weights as safetensors (A's config,
generation config and tokenizer files) and ``merge.json`` (A, B, alpha), written into a temporary sibling of
``out`` that is renamed to ``out`` only when whole (``rlft.runs.checkpoint.write_dir``: a failed write raises
``WriteFailed`` and leaves nothing under ``out``); an existing ``out`` is
refused rather than replaced.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from rlft.config import ConfigError
from rlft.runs.checkpoint import write_dir

IGNORED_CONFIG_KEYS = ("_name_or_path", "transformers_version")
"""config.json keys that name no architecture: they may differ between A and B."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")
"""Files of a model directory that hold (or index) its weights: not copied from A."""


def merge_models(a: str | os.PathLike, b: str | os.PathLike, alpha: float, out: str | os.PathLike) -> Path:
    """Write (1 - ``alpha``) A + ``alpha`` B into ``out`` (see the module's docstring); returns ``out``."""
    a, b, out = Path(a), Path(b), Path(out)
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and 0 <= alpha <= 1):
        raise ConfigError(f"merge: --alpha must be a number in [0, 1] (the weight of B), got {alpha}")
    if out.exists():
        raise ConfigError(f"merge: --out {out} exists; give a new directory (nothing is overwritten)")
    check_model_dir(a, "A")
    check_model_dir(b, "B")
    config_mismatch = first_difference(_config(a), _config(b))
    if config_mismatch is not None:
        key, va, vb = config_mismatch
        raise ConfigError(f"merge: config.json differs at {key!r}: A ({a}) has {va!r}, B ({b}) has {vb!r}; the two "
                          "models must share one architecture")
    check_same_tokenizer(a, b)
    merged = merged_tensors(Weights(a), Weights(b), float(alpha))
    write_dir(out, lambda tmp: _fill(tmp, a, b, float(alpha), merged))  # whole, or nothing under out
    return out


def check_model_dir(path: Path, which: str) -> None:
    """A clear error unless ``path`` is a local directory with a whole model's config.json and weights."""
    if not path.is_dir():
        raise ConfigError(f"merge: {which}: {path}: no such directory (rlft merge reads local model directories)")
    if not (path / "config.json").is_file():
        kind = ("LoRA adapters; merge them into their base first (lora.save=merged)"
                if (path / "adapter_config.json").is_file() else
                "several roles' adapters" if (path / "roles.json").is_file() else "no model")
        raise ConfigError(f"merge: {which}: {path} holds {kind} (no config.json)")
    Weights(path)  # weights present and readable


def _config(path: Path) -> dict:
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"merge: {path / 'config.json'}: unreadable ({e})") from None
    return {k: v for k, v in cfg.items() if k not in IGNORED_CONFIG_KEYS}


def first_difference(x, y, key: str = "") -> tuple[str, object, object] | None:
    """(dotted key, x's value, y's value) of the first place two JSON values differ (keys in sorted order), or None.

    >>> first_difference({"a": 1, "b": {"c": 2, "d": 3}}, {"a": 1, "b": {"c": 2, "d": 4}})
    ('b.d', 3, 4)
    >>> first_difference({"a": 1}, {"a": 1, "e": 0})
    ('e', '<absent>', 0)
    """
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y)):
            sub = f"{key}.{k}" if key else k
            if k not in x or k not in y:
                return sub, x.get(k, "<absent>"), y.get(k, "<absent>")
            found = first_difference(x[k], y[k], sub)
            if found is not None:
                return found
        return None
    return None if x == y and type(x) is type(y) else (key or "<root>", x, y)


def check_same_tokenizer(a: Path, b: Path) -> None:
    """A ``ConfigError`` naming the first part in which A's and B's tokenizers differ (or that one has none)."""
    from rlft.models.loading import load_tokenizer

    sigs = []
    for which, path in (("A", a), ("B", b)):
        try:
            sigs.append(tokenizer_signature(load_tokenizer(str(path))))
        except Exception as e:  # whatever transformers raises for a missing or broken tokenizer
            raise ConfigError(f"merge: {which}: {path}: no usable tokenizer ({e}); the output takes A's tokenizer, "
                              "checked equal to B's") from None
    for part in sigs[0]:
        if sigs[0][part] != sigs[1][part]:
            found = first_difference(sigs[0][part], sigs[1][part], part)
            where = f" at {found[0]!r}" if found is not None and found[0] != part else ""
            raise ConfigError(f"merge: the tokenizers of A ({a}) and B ({b}) differ in their {part}{where}; the "
                              "merged model takes A's tokenizer, which must be B's too")


def tokenizer_signature(tok) -> dict:
    """What makes two tokenizers encode and decode alike: vocabulary, special tokens, chat template, and a fast
    tokenizer's whole definition (normalizer, pre-tokenizer, model, decoder, added tokens) without its padding and
    truncation settings."""
    sig = {"vocabulary": dict(tok.get_vocab()),
           "special tokens": {k: str(v) for k, v in tok.special_tokens_map.items()},
           "chat template": tok.chat_template or ""}
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        definition = json.loads(backend.to_str())
        sig["definition"] = {k: v for k, v in definition.items() if k not in ("padding", "truncation")}
    return sig


class Weights:
    """The named tensors of a model directory, read one at a time: safetensors (memory-mapped) or torch's pickles
    (read with ``weights_only=True``), single-file or sharded."""

    def __init__(self, path: Path):
        self.path = path
        self.files = _weight_files(path)
        self.where: dict[str, Path] = {}
        self._loaded: dict[Path, dict] = {}
        for f in self.files:
            for name in self._names(f):
                self.where[name] = f

    def _names(self, f: Path) -> list[str]:
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as handle:
                return list(handle.keys())
        return list(self._pickled(f))

    def _pickled(self, f: Path) -> dict:
        if f not in self._loaded:
            try:
                self._loaded[f] = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
            except Exception as e:  # a pickle that needs more than tensors, or a broken file
                raise ConfigError(f"merge: {f}: not a plain state dict of tensors ({type(e).__name__}: {e})") from None
        return self._loaded[f]

    def get(self, name: str) -> torch.Tensor:
        f = self.where[name]
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as handle:
                return handle.get_tensor(name)
        return self._pickled(f)[name]


def _weight_files(path: Path) -> list[Path]:
    """The files holding a model directory's weights (an index's shards, or the single file)."""
    for index, single in (("model.safetensors.index.json", "model.safetensors"),
                          ("pytorch_model.bin.index.json", "pytorch_model.bin")):
        if (path / index).is_file():
            try:
                shards = sorted(set(json.loads((path / index).read_text(encoding="utf-8"))["weight_map"].values()))
            except (OSError, ValueError, KeyError) as e:
                raise ConfigError(f"merge: {path / index}: unreadable index ({e})") from None
            missing = [s for s in shards if not (path / s).is_file()]
            if missing:
                raise ConfigError(f"merge: {path}: shard {missing[0]} named by {index} is missing")
            return [path / s for s in shards]
        if (path / single).is_file():
            return [path / single]
    raise ConfigError(f"merge: {path} holds no weights (model.safetensors, pytorch_model.bin or a sharded index)")


def merged_tensors(a: Weights, b: Weights, alpha: float) -> dict[str, torch.Tensor]:
    """{name: (1 - alpha) A + alpha B}, after checking that both hold the same names, shapes and dtypes; the first
    mismatch (names sorted) is a ``ConfigError`` naming the tensor."""
    only_a, only_b = sorted(set(a.where) - set(b.where)), sorted(set(b.where) - set(a.where))
    if only_a or only_b:
        name, side = (only_a[0], "A") if only_a else (only_b[0], "B")
        raise ConfigError(f"merge: tensor {name!r} is only in {side} ({a.path if side == 'A' else b.path}); "
                          f"{len(only_a)} tensors only in A, {len(only_b)} only in B")
    return dict(_interpolated(a, b, alpha))


def _interpolated(a: Weights, b: Weights, alpha: float) -> Iterator[tuple[str, torch.Tensor]]:
    for name in sorted(a.where):
        ta, tb = a.get(name), b.get(name)
        if ta.shape != tb.shape or ta.dtype != tb.dtype:
            raise ConfigError(f"merge: tensor {name!r} differs: A has shape {tuple(ta.shape)} {ta.dtype}, B has "
                              f"{tuple(tb.shape)} {tb.dtype}")
        yield name, interpolate(ta, tb, alpha, name)


def interpolate(ta: torch.Tensor, tb: torch.Tensor, alpha: float, name: str = "tensor") -> torch.Tensor:
    """(1 - alpha) ta + alpha tb, computed in float32 (float64 kept) and cast back to the tensors' dtype; a
    non-floating tensor must be equal in both (it is returned as is).

    >>> interpolate(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 4.0]), 0.25)
    tensor([0.2500, 2.5000])
    """
    if not ta.is_floating_point():
        if not torch.equal(ta, tb):
            raise ConfigError(f"merge: tensor {name!r} ({ta.dtype}) holds no weights to interpolate and differs "
                              "between A and B")
        return ta.clone()
    work = torch.float64 if ta.dtype == torch.float64 else torch.float32
    out = (1.0 - alpha) * ta.to(work) + alpha * tb.to(work)
    return out.to(ta.dtype).contiguous()


def _fill(tmp: Path, a: Path, b: Path, alpha: float, merged: dict[str, torch.Tensor]) -> None:
    """A's files but its weights, the merged weights (safetensors, sharded as huggingface_hub shards), merge.json."""
    from huggingface_hub import save_torch_state_dict

    for f in sorted(a.iterdir()):
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES):
            shutil.copy2(f, tmp / f.name)
    save_torch_state_dict(merged, tmp, metadata={"format": "pt"})
    (tmp / "merge.json").write_text(json.dumps({"a": str(a.resolve()), "b": str(b.resolve()), "alpha": alpha,
                                                "formula": "(1 - alpha) * A + alpha * B"}, indent=2) + "\n",
                                    encoding="utf-8")
