#!/bin/bash
# fucina-serve's prefix cache: time to first token of 16 streaming clients
# whose prompts share a system prompt, with the cache off and on, alternating
# in the same run (a fresh server each time, so every "on" run starts cold).
# Bounded: benches/serve/load.py. Not CI.
#
#   cargo build --release -p fucina-serve
#   benches/serve/prefix.sh MODEL.gguf [THREADS] [SYSTEM_TOKENS] [OWN_TOKENS] [ROUNDS]
set -u
cd "$(dirname "$0")/../.."
M=$1
T=${2:-2}
SYS=${3:-200}
OWN=${4:-56}
ROUNDS=${5:-3}
VOCAB=${VOCAB:-49152}  # the ids are drawn below it (TinyLlama: VOCAB=32000)
echo "== $(date -u +%H:%M:%S) $M; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); $T threads; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "-- 16 clients x 1 request: $SYS shared + $OWN own prompt ids, 128 greedy tokens"
for r in $(seq "$ROUNDS"); do
  for mib in 0 64; do
    target/release/fucina-serve --model "$M" --port 18092 --threads "$T" --max-batch 16 --ctx-len 2048 \
        --prefix-cache-mib "$mib" > /tmp/fucina-serve-prefix.log 2>&1 &
    FS=$!
    for _ in $(seq 100); do curl -sf http://127.0.0.1:18092/health > /dev/null && break; sleep 0.2; done
    echo -n "round $r, prefix cache $mib MiB: "
    timeout 600 python3 benches/serve/load.py --url http://127.0.0.1:18092 --clients 16 --requests 1 \
        --system-tokens "$SYS" --prompt-tokens "$OWN" --max-tokens 128 --prompt-kind ids \
        --vocab "$VOCAB" --deadline 300
    curl -s http://127.0.0.1:18092/metrics | grep -E '^fucina_prefix_cache_hit' | tr '\n' ' '
    echo
    kill -TERM $FS; wait $FS
  done
done
echo "== $(date -u +%H:%M:%S) done; load $(cut -d' ' -f1-3 /proc/loadavg)"
