#!/usr/bin/env bash
# The figures of the open issues' goals (26: tool calls and json_schema; 27: rows, the main job, 8 clients, agent
# traffic), one after the other on a quiet machine, about 25 minutes after the builds:
#     bash benchmarks/goals.sh NAME     → benchmarks/results/*-NAME.md (NAME: the machine, e.g. amd, icelake)
# Needs `bash scripts/setup.sh test llamacpp` and `bash benchmarks/build_llama_cpp_tools.sh` first. Name the CPU by
# `grep -m1 'model name' /proc/cpuinfo` as well as its flags: an AMD EPYC (Zen 4) and an Intel Ice Lake print the
# same avx2 avx512f avx512_vnni.
set -uo pipefail
cd "$(dirname "$0")/.."
name="${1:?usage: bash benchmarks/goals.sh NAME (the machine, e.g. amd or icelake)}"
source .venv/bin/activate
R=benchmarks/results
log() { echo "=== $(date -u +%H:%M:%S) $*"; }
log "$(grep -m1 'model name' /proc/cpuinfo)"; log flags $(grep -o -w -E 'avx2|avx512f|avx512_vnni|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')
log rows; python benchmarks/target_rows.py --repeats 5 --out "$R/target-rows-panels-$name.md"
log concurrency; python benchmarks/serve_compare.py --sections concurrency --out "$R/serve-compare-concurrency-steered-$name"
log main job; specdec bench --backends native --temperatures 0 --modes plain model:auto llamacpp-cli-plain llamacpp-cli-spec \
  --categories code-writing code-editing --prompts-per-category 3 --max-new-tokens 128 --threads 2 --out "$R" \
  --name "main-job-panels-$name"
log structured and tools; python benchmarks/serve_compare.py --sections structured tools --out "$R/serve-compare-schema-panels-$name"
log agent traffic; python benchmarks/agent_traffic.py --ours none history+lookup+model --llama none ngram-mod ngram-cache \
  ngram-mod,draft-simple --turns 2 --tasks 2 --rounds 2 --max-tokens 96 --out "$R/agent-traffic-panels-$name"
log done
