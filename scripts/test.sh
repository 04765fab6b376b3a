#!/usr/bin/env bash
# Set up (idempotent) and run the test suite. With no arguments, also:
# - check that the math core's own unit tests cover every line of rlft/core;
# - rerun the numerics tests (core math, aggregation, micro-batching, masking) under other float arithmetic:
#   CPU kernels for another instruction set (ATEN_CPU_CAPABILITY), MKL's conservative code path (MKL_CBWR)
#   and 1 or 2 threads, so a tolerance that only this machine's rounding meets fails here, not on the next one.
# - build the documentation site (mkdocs.yml) with --strict into .site/ (ignored by git): a link to a missing page
#   or heading fails, first, in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser.sh
bash scripts/cxx.sh
if [ "$#" -gt 0 ]; then  # the tests asked for, and nothing more
  exec .venv/bin/python -m pytest --durations=15 "$@"
fi
.venv/bin/mkdocs build --strict --site-dir .site  # not --quiet: it hides the warnings that --strict counts
# two workers (pytest-xdist): most tests use one core; tests/conftest.py keeps the ones that must not run beside
# each other in one worker
.venv/bin/python -m pytest -n 2 --dist loadgroup --durations=15
core=(tests/test_advantages.py tests/test_losses.py tests/test_kl.py tests/test_value.py tests/test_shaping.py
      tests/test_core_ops.py tests/test_passk.py tests/test_preference.py tests/test_process_advantage.py
      tests/test_reward_hacking.py tests/test_chunked_logprobs.py tests/test_trust_region_losses.py
      tests/test_rollout_corr.py tests/test_distill.py tests/test_sampling_math.py tests/test_support.py)
.venv/bin/python -m pytest --cov=rlft.core --cov-report=term-missing:skip-covered --cov-fail-under=100 "${core[@]}"
second="RLFT_TEST_THREADS=2"
if grep -qw avx2 /proc/cpuinfo 2>/dev/null; then  # AVX2 kernels only where the CPU has them
  second="ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE $second"
fi
for setting in "ATEN_CPU_CAPABILITY=default RLFT_TEST_THREADS=1" "$second"; do
  echo "numerics under $setting"
  env $setting .venv/bin/python -m pytest "${core[@]}" tests/test_rl_loop.py tests/test_lean_decoder.py
done
