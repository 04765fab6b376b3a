"""Write the short workload's prompts: ``{"prompt": "a+b="}`` rows, a and b in 10..99 (about 6 characters each).

    python benchmarks/short_prompts.py --out /tmp/short.jsonl --rows 256
"""

from __future__ import annotations

import argparse
import json
import random


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with open(a.out, "w", encoding="utf-8") as f:
        for _ in range(a.rows):
            x, y = rng.randint(10, 99), rng.randint(10, 99)
            f.write(json.dumps({"prompt": f"{x}+{y}=", "answer": f"#### {x + y}"}) + "\n")


if __name__ == "__main__":
    main()
