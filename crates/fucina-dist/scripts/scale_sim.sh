#!/usr/bin/env bash
# The gradient reduction at up to 16 (oversubscribed) ranks, checked against
# the one-process run and against the traffic model: for each rank count and
# reduction, `reduce_sim` checks the gradient's bits against LocalDataParallel
# on every rank, and Open MPI's own traffic monitoring (the `monitoring` PML)
# measures what each rank really received. The setup's traffic (broadcasts,
# shape checks) is removed by running 1 and 3 steps and halving the
# difference. Fails (exit 1) if the bits differ, if a rank's measured bytes
# differ from what it reports (`bytes_received_per_step`), if they are more
# than 1% off the model, or if the tree moves more than 1.25x a ring
# all-reduce.
#
#   crates/fucina-dist/scripts/scale_sim.sh
#   RANKS="2 4 8 16" PARAMS=262144 MICROBATCHES=16 crates/fucina-dist/scripts/scale_sim.sh
#
# Environment: RANKS (default "1 2 3 4 8 16"), PARAMS (gradient elements,
# default 65536), MICROBATCHES (default 16), PROFILE (cargo profile, default
# release).
set -euo pipefail
cd "$(dirname "$0")/../../.."
profile=${PROFILE:-release}
cargo build --profile "$profile" -q -p fucina-dist --example reduce_sim
dir=$profile
[[ $profile == dev ]] && dir=debug
exe=target/$dir/examples/reduce_sim
ranks=${RANKS:-1 2 3 4 8 16}
params=${PARAMS:-65536}
mb=${MICROBATCHES:-16}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# Bytes each rank received, from one run's monitoring files: "rank bytes" lines.
received() {
    cat "$1"/prof.*.prof | awk -F'\t' '$1 == "E" { split($4, b, " "); r[$3] += b[1] } END { for (k in r) print k, r[k] }' | sort
}

echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; params $params, microbatches $mb"
echo "| ranks | reduction | bits vs one process | measured bytes / rank / step (min-max) | reported (min-max) | model (min-max) | ring all-reduce | measured max / ring |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for np in $ranks; do
    for red in tree allgather; do
        for steps in 1 3; do
            mkdir -p "$tmp/$np-$red-$steps"
            set +e
            mpirun --oversubscribe --bind-to none -np "$np" \
                --mca pml_monitoring_enable 1 --mca pml_monitoring_enable_output 3 \
                --mca pml_monitoring_filename "$tmp/$np-$red-$steps/prof" \
                "$exe" --params "$params" --microbatches "$mb" --steps "$steps" --reduction "$red" \
                >"$tmp/$np-$red-$steps.out" 2>"$tmp/$np-$red-$steps.err"
            rc=$?
            set -e
        done
        out="$tmp/$np-$red-3.out"
        if grep -q '^refused:' "$out"; then
            echo "| $np | $red | refused: \`$(sed -n 's/^refused: //p' "$out" | cut -c1-60)...\` | – | – | – | – | – |"
            if [[ $red == allgather ]]; then fail=1; fi
            continue
        fi
        line=$(grep '^sim ' "$out" || true)
        if [[ $rc -ne 0 || -z $line ]]; then
            echo "| $np | $red | FAILED (exit $rc) | | | | | |"
            cat "$tmp/$np-$red-3.err" >&2
            fail=1
            continue
        fi
        ring=$(awk '{for (i = 1; i < NF; i++) if ($i == "ring") print $(i + 1)}' <<<"$line")
        # Per rank: measured (3 steps - 1 step) / 2, and reported.
        join <(received "$tmp/$np-$red-1") <(received "$tmp/$np-$red-3") \
            | awk '{print $1, ($3 - $2) / 2}' >"$tmp/measured"
        grep '^rank ' "$out" | awk '{print $2, $4, $6}' | sort >"$tmp/reported"
        # One rank talks to nobody: no monitoring lines.
        if (( np == 1 )); then echo "0 0" >"$tmp/measured"; fi
        # Columns: rank, measured, reported, model.
        verdict=$(join "$tmp/measured" "$tmp/reported" | awk -v ring="$ring" -v red="$red" -v np="$np" '
            { n++; if ($2 != $3) bad = bad " rank " $1 " measured " $2 " reported " $3;
              if ($2 > $4 * 1.01 || $2 < $4 * 0.99) bad = bad " rank " $1 " measured " $2 " model " $4;
              if (red == "tree" && np > 1 && $2 > 1.25 * ring) bad = bad " rank " $1 " above 1.25x ring";
              if (n == 1 || $2 < min) min = $2; if (n == 1 || $2 > max) max = $2;
              if (n == 1 || $3 < rmin) rmin = $3; if (n == 1 || $3 > rmax) rmax = $3;
              if (n == 1 || $4 < mmin) mmin = $4; if (n == 1 || $4 > mmax) mmax = $4 }
            END { if (n != np) bad = bad " " n " of " np " ranks measured";
                  printf "%s|%s-%s|%s-%s|%s-%s|%.3f\n", (bad == "" ? "ok" : "FAIL:" bad), min, max, rmin, rmax, mmin, mmax, (ring > 0 ? max / ring : 0) }')
        status=${verdict%%|*}
        rest=${verdict#*|}
        IFS='|' read -r meas rep model ratio <<<"$rest"
        [[ $status == ok ]] || fail=1
        echo "| $np | $red | same bits; bytes $status | $meas | $rep | $model | $ring | ${ratio}x |"
    done
done
exit $fail
