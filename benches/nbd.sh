#!/bin/bash
# just bench nbd: the NBD front end alone (srp-ublk serve --backend mem) against nbdkit's memory plugin
# and qemu-nbd on a RAM file, in one run, with fio's nbd engine over unix sockets: 4 KiB randread and
# randwrite at QD1 and QD32, 1 and 2 jobs, interleaved rounds; the median IOPS per case and the ratios
# srp-ublk / nbdkit and srp-ublk / qemu-nbd. Writes target/bench/nbd-<time>.json and prints a markdown
# table (docs/bench/performance-record.md keeps the latest).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${BENCH_ROUNDS:-3}
RUNTIME=${BENCH_RUNTIME:-5}
SIZE=1G
BIN=${SRP_UBLK_BIN:-target/release/srp-ublk}
for t in fio nbdkit qemu-nbd python3; do
    command -v $t >/dev/null || { echo "bench: $t missing: apt-get install fio nbdkit qemu-utils" >&2; exit 2; }
done
[ -x "$BIN" ] || { echo "bench: build first (cargo build --release)" >&2; exit 2; }
D=$(mktemp -d /dev/shm/srp-ublk-bench.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$D"; }
trap cleanup EXIT
"$BIN" serve --backend mem:$SIZE --nbd unix:$D/srp.sock --name b >/dev/null 2>&1 & PIDS+=($!)
nbdkit --foreground --unix $D/nbdkit.sock memory $SIZE >/dev/null 2>&1 & PIDS+=($!)
truncate -s $SIZE $D/qemu.raw
qemu-nbd --persistent --shared=8 --format=raw --export-name=b --socket=$D/qemu.sock $D/qemu.raw >/dev/null 2>&1 & PIDS+=($!)
for s in srp nbdkit qemu; do
    i=0; while [ ! -S $D/$s.sock ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
    [ -S $D/$s.sock ] || { echo "bench: $s did not start" >&2; exit 1; }
done
declare -A URI=([srp]="nbd+unix:///b?socket=$D/srp.sock" [nbdkit]="nbd+unix:///?socket=$D/nbdkit.sock" [qemu]="nbd+unix:///b?socket=$D/qemu.sock")
# prefill so reads read data
for s in srp nbdkit qemu; do
    fio --name=fill --ioengine=nbd --uri="${URI[$s]}" --rw=write --bs=1m --iodepth=8 --size=256m --eta=never --output=/dev/null
done
CASES="randread:1:1 randread:32:1 randread:32:2 randwrite:1:1 randwrite:32:1 randwrite:32:2"
RES=$D/results.txt
for r in $(seq 1 "$ROUNDS"); do
    for c in $CASES; do
        IFS=: read -r rw qd jobs <<< "$c"
        for s in srp nbdkit qemu; do
            iops=$(fio --name=b --ioengine=nbd --uri="${URI[$s]}" --rw=$rw --bs=4k --iodepth=$qd \
                --numjobs=$jobs --size=256m --runtime=$RUNTIME --time_based --group_reporting \
                --eta=never --output-format=json | python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))')
            echo "$rw-4k-qd$qd-j$jobs $s $r $iops" >> $RES
            echo "round $r $rw-4k-qd$qd-j$jobs $s: $iops IOPS" >&2
        done
    done
done
mkdir -p target/bench
OUT=target/bench/nbd-$(date -u +%Y%m%dT%H%M%SZ).json
python3 - "$RES" "$OUT" "$ROUNDS" "$RUNTIME" <<'PY'
import json, sys, statistics, datetime, platform
res, out, rounds, runtime = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
data = {}
for line in open(res):
    case, s, r, iops = line.split()
    data.setdefault(case, {}).setdefault(s, []).append(int(iops))
cases = []
print(f"| case | srp-ublk mem | nbdkit memory | qemu-nbd (RAM file) | srp-ublk / nbdkit | srp-ublk / qemu-nbd |")
print("|---|---|---|---|---|---|")
for case, d in data.items():
    m = {s: statistics.median(v) for s, v in d.items()}
    spread = {s: [min(v), max(v)] for s, v in d.items()}
    c = {"name": case, "unit": "IOPS", "srp_ublk": m["srp"], "nbdkit": m["nbdkit"], "qemu_nbd": m["qemu"],
         "ratio_nbdkit": round(m["srp"] / m["nbdkit"], 2), "ratio_qemu_nbd": round(m["srp"] / m["qemu"], 2),
         "spread": spread}
    cases.append(c)
    print(f"| {case} | {m['srp']:.0f} | {m['nbdkit']:.0f} | {m['qemu']:.0f} | {c['ratio_nbdkit']:.2f} | {c['ratio_qemu_nbd']:.2f} |")
json.dump({"date": datetime.datetime.utcnow().isoformat() + "Z", "host": platform.node(), "kernel": platform.release(),
           "command": "just bench nbd", "rounds": rounds, "runtime_s": runtime, "cases": cases}, open(out, "w"), indent=1)
print(f"\n(medians of {rounds} interleaved rounds of {runtime} s; JSON: {out})")
PY
