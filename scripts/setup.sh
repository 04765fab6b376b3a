#!/usr/bin/env bash
# Create .venv with rlft installed (CPU torch first: the pinned wheel installs without CUDA packages).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[dev,lang,lora,deepspeed,docs]"
