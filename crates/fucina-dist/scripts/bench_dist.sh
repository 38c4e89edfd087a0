#!/usr/bin/env bash
# Steps per second and bytes per rank and step of train_digits_dist with 1, 2
# and 4 ranks, for both reductions (the tree, and the allgather with and
# without overlap), against the one-process run of the same microbatch split,
# in one run (same-run baseline). Each configuration trains EPOCHS epochs; the
# figure is the median over the epochs after the first (warm-up) of the
# per-epoch `timing` lines, with the min-max of those epochs.
#
#   crates/fucina-dist/scripts/bench_dist.sh [extra train_digits_dist args]
#   e.g. EPOCHS=8 crates/fucina-dist/scripts/bench_dist.sh --hidden 512 --batch 512
#
# Environment: EPOCHS (default 6), CORES (default: nproc), THREADS (each
# rank's team size, default 1).
# Ranks that fit the cores with one thread each are bound one per core
# (`--bind-to core`: on the 2-core development machine, unbound ranks sometimes
# share a core and halve the rate); with more ranks or threads than cores they
# run `--bind-to none` (a bound rank would put its whole worker team on one
# core).
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build --release -q -p fucina-dist --example train_digits_dist
exe=target/release/examples/train_digits_dist
epochs=${EPOCHS:-6}
cores=${CORES:-$(nproc)}
threads=${THREADS:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Field `$1` (e.g. steps/s) of the timing lines after the first: "median (min-max)".
stat() {
    grep '^timing' | tail -n +2 | awk -v key="$1" '{for (i = 1; i < NF; i++) if ($i == key) print $(i + 1)}' \
        | tr -d % | sort -g | awk '{a[NR] = $1} END {
            m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
            if (a[1] == a[NR]) print m; else printf "%s (%s-%s)\n", m, a[1], a[NR] }'
}
median() { stat "$1" | cut -d' ' -f1; }

base_sps=""
report() { # label, output
    local out=$1 label=$2 sps ratio bytes ring vs_ring
    sps=$(median steps/s <<<"$out")
    [[ -z $base_sps ]] && base_sps=$sps
    ratio=$(awk -v a="$sps" -v b="$base_sps" 'BEGIN {printf "%.2fx", a / b}')
    bytes=$(median bytes_received_per_step <<<"$out")
    ring=$(median ring_bytes_per_step <<<"$out")
    vs_ring=$(awk -v a="$bytes" -v b="$ring" 'BEGIN {if (b > 0) printf "%.3fx", a / b; else print "–"}')
    printf '| %s | %s | %s | %s | %s | %s | %s | %s%% | %s | %s | %s |\n' \
        "$label" "$(stat steps/s <<<"$out")" "$ratio" "$(median step_ms <<<"$out")" \
        "$(median compute_ms <<<"$out")" "$(median exchange_ms <<<"$out")" \
        "$(median reduce_ms <<<"$out")" "$(median exchange_share <<<"$out")" \
        "$bytes" "$ring" "$vs_ring"
}

echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $cores cores; args: --epochs $epochs $*"
echo "| run | steps/s median (min-max) | vs baseline | step ms | compute ms | exchange ms | reduce ms | exchange share | bytes received / rank / step | ring all-reduce | bytes / ring |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
report "$("$exe" --local --bench --epochs "$epochs" --threads "$cores" "$@")" \
    "one process, threads $cores (baseline)"
report "$("$exe" --local --bench --epochs "$epochs" --threads 1 "$@")" "one process, threads 1"
for np in 1 2 4; do
    over="" bind=core
    (( threads > 1 || np > cores )) && bind=none
    (( np * threads > cores )) && over=", oversubscribed"
    for red in tree allgather "allgather --no-overlap"; do
        # shellcheck disable=SC2086 # `$red` is a reduction and maybe a flag
        out=$(OMPI_MCA_mpi_yield_when_idle=1 mpirun --oversubscribe --bind-to "$bind" -np "$np" "$exe" \
            --bench --epochs "$epochs" --threads "$threads" --reduction $red "$@")
        report "$out" "mpirun -np $np, threads $threads$over, bind $bind, $red"
    done
done
