#!/bin/bash
# fucina-llm's bench example and llama.cpp (benches/llm/llamacpp_compare.py) on
# the same GGUF files, back to back: for each format, fucina, llama.cpp's
# default path, then llama.cpp's plain kernels (--no-extra-bufts; skipped with
# PLAIN=0). Not part of CI; see benches/README.md.
#
# usage: benches/llm/llamacpp_compare.sh GGUF_DIR STEM THREADS FORMAT...
#   e.g. benches/llm/llamacpp_compare.sh /work/llm-bench/gguf smollm2-135m-shape 2 bf16 q8_0 q4_0
# env: BENCH (default target/release/examples/bench), PY (a python with
#      llama-cpp-python, default python3), ARGS (default: the figures' protocol)
set -e
DIR=$1; STEM=$2; T=$3; shift 3
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=${BENCH:-$HERE/../../target/release/examples/bench}
PY=${PY:-python3}
ARGS=${ARGS:-"--prefill 512 --batch 1,8 --decode 32 --reps 3"}
for f in "$@"; do
  g=$DIR/$STEM-$f.gguf
  echo "=== $STEM $f threads $T: fucina $(date +%T)"
  "$BENCH" --model "$g" --threads "$T" $ARGS
  echo "=== $STEM $f threads $T: llama.cpp default (repack) $(date +%T)"
  "$PY" "$HERE/llamacpp_compare.py" llama --gguf "$g" --threads "$T" $ARGS
  [ "${PLAIN:-1}" = 0 ] && continue
  echo "=== $STEM $f threads $T: llama.cpp --no-extra-bufts $(date +%T)"
  "$PY" "$HERE/llamacpp_compare.py" llama --gguf "$g" --threads "$T" $ARGS --no-extra-bufts
done
