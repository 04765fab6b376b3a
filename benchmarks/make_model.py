"""Build a randomly initialised benchmark model (the embedded model's architecture and character tokenizer) in a directory.

    python benchmarks/make_model.py --out /tmp/m05 --hidden 128 --layers 2              # about 0.5M parameters
    python benchmarks/make_model.py --out /tmp/m34 --hidden 512 --layers 8 --mlp 2048   # about 34M parameters

The architecture is Llama's (Qwen2's without the q/k/v biases): transformers 5 rebuilds the
tokenizer of a ``qwen2`` directory as byte-level BPE, which would drop the character vocabulary.
"""

from __future__ import annotations

import argparse

from rlft.models.tiny import build_tiny_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--mlp", type=int, default=0, help="MLP width (default 3 x hidden)")
    ap.add_argument("--max-positions", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    path = build_tiny_model(a.out, hidden_size=a.hidden, layers=a.layers, heads=a.heads, intermediate_size=a.mlp,
                            max_positions=a.max_positions, seed=a.seed)
    print(path)


if __name__ == "__main__":
    main()
