#!/usr/bin/env bash
# DeepSpeed's CPU backend compiles its shared-memory communication op at the first ZeRO launch, so the DeepSpeed
# tests (tests/test_dist.py) need a C++ compiler. Install g++ when there is none and this is root on a Debian-like
# system (as in CI); elsewhere those tests skip and say why.
if command -v "${CXX:-c++}" >/dev/null; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "cxx: installing g++ for DeepSpeed's CPU communication op"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q g++; } >/dev/null 2>&1 \
    || echo "cxx: g++ could not be installed; the DeepSpeed tests will skip"
else
  echo "cxx: no C++ compiler and no root apt-get: the DeepSpeed tests will skip"
fi
exit 0
