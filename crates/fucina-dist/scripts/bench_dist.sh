#!/usr/bin/env bash
# Steps per second of train_digits_dist with 1, 2 and 4 ranks against the
# one-process run of the same microbatch split, in one run (same-run baseline).
# Each configuration trains EPOCHS epochs; the figure is the median over the
# epochs after the first (warm-up) of the per-epoch `timing` lines.
#
#   crates/fucina-dist/scripts/bench_dist.sh [extra train_digits_dist args]
#   e.g. crates/fucina-dist/scripts/bench_dist.sh --hidden 512 --batch 512
#
# Environment: EPOCHS (default 6), CORES (default: nproc).
# Ranks run with `--bind-to none`: mpirun's default binds each of up to 2 ranks
# to one core, which puts a rank's whole worker team on that core.
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build --release -q -p fucina-dist --example train_digits_dist
exe=target/release/examples/train_digits_dist
epochs=${EPOCHS:-6}
cores=${CORES:-$(nproc)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Median of field $2 (e.g. steps/s) over the timing lines after the first.
median() {
    grep '^timing' | tail -n +2 | awk -v key="$1" '{for (i = 1; i < NF; i++) if ($i == key) print $(i + 1)}' \
        | sort -g | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}

report() { # label, output
    local out=$2
    printf '| %s | %s | %s | %s | %s | %s | %s%% | %s |\n' \
        "$1" "$(median steps/s <<<"$out")" "$(median step_ms <<<"$out")" \
        "$(median compute_ms <<<"$out")" "$(median exchange_ms <<<"$out")" \
        "$(median reduce_ms <<<"$out")" \
        "$(median exchange_share <<<"$out" | tr -d %)" "$(median bytes_received_per_step <<<"$out")"
}

echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $cores cores; args: --epochs $epochs $*"
echo "| run | steps/s | step ms | compute ms | exchange ms | reduce ms | exchange share | bytes received / step |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
report "one process, threads $cores (baseline)" "$("$exe" --local --bench --epochs "$epochs" --threads "$cores" "$@")"
report "one process, threads 1" "$("$exe" --local --bench --epochs "$epochs" --threads 1 "$@")"
for np in 1 2 4; do
    for threads in 1 2; do
        over=""
        (( np * threads > cores )) && over=", oversubscribed"
        for overlap in "" --no-overlap; do
            label="mpirun -np $np, threads $threads${over}${overlap:+, no overlap}"
            out=$(OMPI_MCA_mpi_yield_when_idle=1 mpirun --oversubscribe --bind-to none -np "$np" "$exe" --bench \
                --epochs "$epochs" --threads "$threads" $overlap "$@")
            report "$label" "$out"
        done
    done
done
