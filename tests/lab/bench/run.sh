#!/bin/bash
# just bench (lab): boot the lab once and run tests/lab/bench/guest.sh, then summarise with report.py:
# target/bench/lab-<time>.json (+ the raw files under target/bench/lab-<time>/), docs/bench/latest.json
# and the table in docs/performance.md. Knobs: BENCH_ROUNDS, BENCH_SECS, BENCH_QUEUES, BENCH_DEPTH,
# BENCH_CASES, BENCH_MODES (see guest.sh); BENCH_NO_DOCS=1 leaves docs/ alone.
set -euo pipefail
# `run.sh counters`: the paired-round counters (counters.sh, counters.py) instead of the full bench
WHAT=${1:-lab}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
command -v python3 >/dev/null || { echo "bench: python3 is needed for the report (apt-get install python3)" >&2; exit 2; }
stamp=$(date -u +%Y%m%dT%H%M%SZ)
# BENCH_BASELINE=BINARY (counters): an older srp-ublk binary runs beside the current one, as the
# initiator srp_ublk_baseline, through a 9p share of its own
extra=
if [ -n "${BENCH_BASELINE:-}" ]; then
    [ -x "$BENCH_BASELINE" ] || { echo "bench: BENCH_BASELINE=$BENCH_BASELINE is not an executable" >&2; exit 2; }
    base_dir=$ROOT/target/bench/baseline
    rm -rf "$base_dir"; mkdir -p "$base_dir"; cp "$BENCH_BASELINE" "$base_dir/srp-ublk"
    extra="-virtfs local,path=$base_dir,mount_tag=baseline,security_model=none,id=baseline"
    BENCH_BASELINE_NAME=baseline
fi
job=$(mktemp /tmp/srp-ublk-bench.XXXXXX.sh)
trap 'rm -f "$job"' EXIT
{
    echo '#!/bin/sh'
    for v in BENCH_ROUNDS BENCH_SECS BENCH_QUEUES BENCH_DEPTH BENCH_CASES BENCH_MODES BENCH_SCOPES \
             BENCH_BASELINE_NAME; do
        [ -n "${!v:-}" ] && printf '%s=%q\n' "$v" "${!v}"
    done
    if [ "$WHAT" = counters ]; then cat "$HERE/counters.sh"; else cat "$HERE/guest.sh"; fi
} > "$job"
t0=$SECONDS
LAB_QEMU_EXTRA="$extra" LAB_TIMEOUT=${LAB_TIMEOUT:-2400} bash "$ROOT/tests/lab/lab.sh" run "$job"
mkdir -p "$ROOT/target/bench"
if [ "$WHAT" = counters ]; then
    raw=$ROOT/target/bench/counters-$stamp
    cp -r "$ROOT/target/lab/out/counters" "$raw"
    python3 "$HERE/counters.py" "$raw" "$raw.json"
    echo "bench counters: $((SECONDS - t0)) s; summary $raw.json; raw results $raw/"
    exit 0
fi
raw=$ROOT/target/bench/lab-$stamp
cp -r "$ROOT/target/lab/out/bench" "$raw"
cmd="just bench"
[ -n "${BENCH_ROUNDS:-}${BENCH_SECS:-}${BENCH_CASES:-}" ] && cmd="BENCH_ROUNDS=${BENCH_ROUNDS:-3} BENCH_SECS=${BENCH_SECS:-5} just bench"
if [ -n "${BENCH_NO_DOCS:-}" ]; then
    python3 "$HERE/report.py" "$raw" "$raw.json" "$cmd"
else
    python3 "$HERE/report.py" "$raw" "$raw.json" "$cmd" "$ROOT/docs/bench/latest.json" "$ROOT/docs/performance.md"
fi
echo "bench: $((SECONDS - t0)) s; summary $raw.json; raw results $raw/"
