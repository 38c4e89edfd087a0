#!/bin/bash
# fucina's `bench` then llama.cpp (llama-cpp-python) on each GGUF file, in one
# window per file: the "Every common GGUF preset against llama.cpp" table of
# docs/BENCHMARKS.md. Not run by CI.
#
#   PY=/path/to/venv/bin/python benches/llm/preset_compare.sh THREADS FILE.gguf...
#
# Needs `cargo build --release -p fucina-llm --example bench` first and a venv
# with llama-cpp-python (see benches/llm/llamacpp_compare.py).
set -u
T=$1; shift
PY=${PY:-python3}
cd "$(dirname "$0")/../.."
grep -m1 "model name" /proc/cpuinfo; grep -m1 "cpu family" /proc/cpuinfo; grep -m1 "^model\s" /proc/cpuinfo
for f in "$@"; do
  echo "=== $f threads=$T $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  target/release/examples/bench --model "$f" --threads "$T" --prefill 512 --batch 1,8 --decode 32 --reps 3 --stream-mib 512 2>&1 \
    | grep -E "^formats|prefill 512|decode batch|stream read|bandwidth limit|greedy"
  OPENBLAS_CORETYPE= "$PY" benches/llm/llamacpp_compare.py llama --gguf "$f" --threads "$T" --prefill 512 --batch 1,8 --decode 32 --reps 3 2>&1 \
    | grep -E "prefill 512|decode batch|greedy"
done
