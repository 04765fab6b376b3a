#!/usr/bin/env bash
# Set up (idempotent) and run the test suite; with no arguments, also check that the math core's
# own unit tests cover every line of rlft/core.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest --durations=15 "$@"
if [ "$#" -eq 0 ]; then
  .venv/bin/python -m pytest --cov=rlft.core --cov-report=term-missing:skip-covered --cov-fail-under=100 \
    tests/test_advantages.py tests/test_losses.py tests/test_kl.py tests/test_value.py tests/test_shaping.py \
    tests/test_core_ops.py tests/test_passk.py
fi
