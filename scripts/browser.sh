#!/usr/bin/env bash
# The report's browser test (tests/test_report.py) drives Debian's chromium through selenium. Install chromium and
# its driver when they are missing and this is root on a Debian-like system (as in CI); elsewhere the test skips
# and says why.
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "browser: installing chromium and chromium-driver for the report's browser test"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; } >/dev/null 2>&1 \
    || echo "browser: chromium could not be installed; the browser test will skip"
else
  echo "browser: no chromium/chromedriver and no root apt-get: the report's browser test will skip"
fi
exit 0
