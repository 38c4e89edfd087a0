#!/bin/bash
# fucina-serve against llama-cpp-python's OpenAI server on the same GGUF file,
# same thread count, text prompts (bounded: benches/serve/load.py). Not CI.
#
#   cargo build --release -p fucina-serve && cargo build --release -p fucina-llm --example generate
#   [VOCAB=32000] benches/serve/compare.sh MODEL.gguf /path/to/venv-with-llama-cpp-python/bin/python [THREADS]
#
# llama-cpp-python's server: `pip install 'llama-cpp-python[server]'` built as
# the header of benches/llm/llamacpp_compare.py says. It runs with
# --interrupt_requests False (by default a new request interrupts the running
# one, which truncates every answer under concurrency).
set -u
cd "$(dirname "$0")/../.."
M=$1
PY=$2
T=${3:-2}
echo "== $(date -u +%H:%M:%S) $M; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); $T threads; load $(cut -d' ' -f1-3 /proc/loadavg)"
VOCAB=${VOCAB:-49152}  # generate's prompt ids are drawn below it (TinyLlama: VOCAB=32000)
IDS=$(python3 -c "import random; r=random.Random(7); print(','.join(str(r.randrange(3,$VOCAB)) for _ in range(256)))")
echo "-- generate (the decode speed to compare 1 client with)"
for i in 1 2 3; do
  target/release/examples/generate --model "$M" --prompt-ids "$IDS" --max-new-tokens 128 --threads "$T" 2>&1 | grep '^prefill'
done
target/release/fucina-serve --model "$M" --port 18090 --threads "$T" --max-batch 16 --ctx-len 2048 > /tmp/fucina-serve-bench.log 2>&1 &
FS=$!
# Wait until it answers (a large model takes a while to load on a busy machine).
for _ in $(seq 600); do curl -sf http://127.0.0.1:18090/health > /dev/null && break; sleep 0.5; done
echo "-- fucina-serve"
timeout 900 python3 benches/serve/load.py --url http://127.0.0.1:18090 --clients 1,4,16 --requests 3,2,1 \
    --prompt-tokens 256 --max-tokens 128 --prompt-kind text --deadline 300
kill -TERM $FS; wait $FS
"$PY" -m llama_cpp.server --model "$M" --n_threads "$T" --n_threads_batch "$T" --n_ctx 2048 --port 18091 \
    --interrupt_requests False > /tmp/llama-cpp-server-bench.log 2>&1 &
LS=$!
for _ in $(seq 600); do curl -sf http://127.0.0.1:18091/v1/models > /dev/null && break; sleep 0.5; done
echo "-- llama-cpp-python server $("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)')"
timeout 900 python3 benches/serve/load.py --url http://127.0.0.1:18091 --clients 1,4,16 --requests 3,2,1 \
    --prompt-tokens 256 --max-tokens 128 --prompt-kind text --deadline 300
kill $LS; wait $LS 2>/dev/null
echo "== $(date -u +%H:%M:%S) done; load $(cut -d' ' -f1-3 /proc/loadavg)"
