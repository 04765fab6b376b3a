#!/usr/bin/env bash
# Set up (idempotent) and run the embedded demo: tiny model, SFT warm-up, GRPO, evaluation.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/rlft train "$@"
