#!/usr/bin/env bash
# The main job on the default pair: install, then generate code with speculative decoding and
# compare against plain decoding of the same prompt (same settings, measured in the same run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
prompt=${1:-"Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring."}
exec .venv/bin/specdec generate "$prompt" --compare --max-new-tokens 128 "${@:2}"
