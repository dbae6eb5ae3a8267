#!/bin/bash
# just bench (lab): boot the lab once and run tests/lab/bench/guest.sh, then summarise with report.py:
# target/bench/lab-<time>.json (+ the raw files under target/bench/lab-<time>/), docs/bench/latest.json
# and the table in docs/performance.md. Knobs: BENCH_ROUNDS, BENCH_SECS, BENCH_QUEUES, BENCH_DEPTH,
# BENCH_CASES, BENCH_MODES, BENCH_MODE_ROUNDS, BENCH_SCOPES (see guest.sh); BENCH_NO_DOCS=1 leaves docs/
# alone. BENCH_PAIR=1 (counters only): the target in a guest of its own (lab.sh pair), so that the
# initiator guest's CPU is the initiator's, its fabric side's and fio's only.
set -euo pipefail
# `run.sh counters`: the paired-round counters (counters.sh, counters.py) instead of the full bench;
# `run.sh luns`: 8 LUNs of one target port at once (luns.sh, luns.py)
WHAT=${1:-lab}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
command -v python3 >/dev/null || { echo "bench: python3 is needed for the report (apt-get install python3)" >&2; exit 2; }
stamp=$(date -u +%Y%m%dT%H%M%SZ)
# Binaries the guest runs beside srp-ublk, through a 9p share of their own ("baseline"):
# BENCH_BASELINE=BINARY (counters, luns): an older srp-ublk binary, as the initiator srp_ublk_baseline;
# rublk (counters, unless BENCH_RUBLK=0): its null target against `srp-ublk add --backend null`,
# built here once (crates.io, into target/bench/rublk) when missing
base_dir=$ROOT/target/bench/baseline
rm -rf "$base_dir"; mkdir -p "$base_dir"
extra="-virtfs local,path=$base_dir,mount_tag=baseline,security_model=none,id=baseline"
if [ -n "${BENCH_BASELINE:-}" ]; then
    [ -x "$BENCH_BASELINE" ] || { echo "bench: BENCH_BASELINE=$BENCH_BASELINE is not an executable" >&2; exit 2; }
    cp "$BENCH_BASELINE" "$base_dir/srp-ublk"
    BENCH_BASELINE_NAME=baseline
fi
RUBLK_VERSION=0.2.15
if [ "$WHAT" = counters ] && [ "${BENCH_RUBLK:-1}" != 0 ]; then
    rublk=$ROOT/target/bench/rublk/bin/rublk
    if ! "$rublk" --version 2>/dev/null | grep -q "$RUBLK_VERSION"; then
        echo "bench: building rublk $RUBLK_VERSION (the ublk peer) into target/bench/rublk"
        cargo install --quiet --locked rublk --version "$RUBLK_VERSION" --no-default-features \
            --root "$ROOT/target/bench/rublk"
    fi
    cp "$rublk" "$base_dir/rublk"
    BENCH_RUBLK=1
else
    unset BENCH_RUBLK
fi
how=run
if [ -n "${BENCH_PAIR:-}" ]; then
    # guest.sh's perftest runs its server and client in one guest
    [ "$WHAT" = counters ] || { echo "bench: BENCH_PAIR is for 'run.sh counters' (just bench counters)" >&2; exit 2; }
    how=pair
fi
job=$(mktemp /tmp/srp-ublk-bench.XXXXXX.sh)
trap 'rm -f "$job"' EXIT
{
    echo '#!/bin/sh'
    for v in BENCH_ROUNDS BENCH_SECS BENCH_QUEUES BENCH_DEPTH BENCH_CASES BENCH_MODES BENCH_SCOPES BENCH_POLLS \
             BENCH_MODE_ROUNDS BENCH_BASELINE_NAME BENCH_RUBLK BENCH_PROFILE; do
        [ -n "${!v:-}" ] && printf '%s=%q\n' "$v" "${!v}"
    done
    case $WHAT in
        counters) cat "$HERE/counters.sh" ;;
        luns) cat "$HERE/luns.sh" ;;
        *) cat "$HERE/guest.sh" ;;
    esac
} > "$job"
t0=$SECONDS
LAB_QEMU_EXTRA="$extra" LAB_TIMEOUT=${LAB_TIMEOUT:-2400} bash "$ROOT/tests/lab/lab.sh" $how "$job"
mkdir -p "$ROOT/target/bench"
# counters and luns: the guest's results under target/bench/WHAT-<time>/, summarised by WHAT.py
if [ "$WHAT" = luns ] || [ "$WHAT" = counters ]; then
    raw=$ROOT/target/bench/$WHAT-$stamp
    out=$WHAT
    [ "$WHAT" = counters ] && out=${BENCH_PAIR:+pair/}counters
    cp -r "$ROOT/target/lab/out/$out" "$raw"
    python3 "$HERE/$WHAT.py" "$raw" "$raw.json"
    echo "bench $WHAT: $((SECONDS - t0)) s; summary $raw.json; raw results $raw/"
    exit 0
fi
raw=$ROOT/target/bench/lab-$stamp
cp -r "$ROOT/target/lab/out/bench" "$raw"
# the command as run: every knob that was set, so that the table says what made it
cmd="just bench"
for v in BENCH_MODE_ROUNDS BENCH_MODES BENCH_SCOPES BENCH_CASES BENCH_DEPTH BENCH_QUEUES BENCH_SECS BENCH_ROUNDS; do
    [ -n "${!v:-}" ] && val=${!v} && cmd="$v=\"${val//$'\n'/ }\" $cmd"
done
if [ -n "${BENCH_NO_DOCS:-}" ]; then
    python3 "$HERE/report.py" "$raw" "$raw.json" "$cmd"
else
    python3 "$HERE/report.py" "$raw" "$raw.json" "$cmd" "$ROOT/docs/bench/latest.json" "$ROOT/docs/performance.md"
fi
echo "bench: $((SECONDS - t0)) s; summary $raw.json; raw results $raw/"
