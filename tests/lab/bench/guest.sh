#!/bin/sh
# The lab half of `just bench`: srp-ublk against the kernel's ib_srp on the same LIO LUN in one boot,
# in paired rounds (each round runs every case on both, srp-ublk first in odd rounds and ib_srp first
# in even ones, so that a drift of the emulated machine falls on both alike; report.py takes the ratio
# within each round), plus the fabric's own limit (perftest) and srp-ublk's three completion modes.
# Raw results (fio JSON, /proc/stat deltas, perftest text) go to $LAB_OUT/bench/; report.py turns them
# into the table and docs/bench/latest.json.
#
# Knobs (the host prepends them): BENCH_ROUNDS (5), BENCH_SECS (10, per run after 1 s ramp),
# BENCH_QUEUES (2: srp-ublk queues = ib_srp ch_count), BENCH_DEPTH (64: srp-ublk depth = ib_srp
# queue_size - 1, ib_srp keeps one slot for task management), BENCH_CASES (all), BENCH_MODES,
# BENCH_MODE_ROUNDS (3), BENCH_SCOPES ("command"; "command login" adds srp-ublk with
# rkey_scope=login to every round, about 8 minutes more).
set -u
ROUNDS=${BENCH_ROUNDS:-5}
SECS=${BENCH_SECS:-10}
QUEUES=${BENCH_QUEUES:-2}
DEPTH=${BENCH_DEPTH:-64}
MODES=${BENCH_MODES:-adaptive interrupt busy}
MODE_ROUNDS=${BENCH_MODE_ROUNDS:-3}
SCOPES=${BENCH_SCOPES:-command}
OUT=$LAB_OUT/bench
mkdir -p "$OUT"
# name rw bs iodepth numjobs
CASES=${BENCH_CASES:-"randread-4k-qd1:randread:4k:1:1 randwrite-4k-qd1:randwrite:4k:1:1
randread-4k-qd32:randread:4k:32:1 randread-4k-qd32x2:randread:4k:32:2
randwrite-4k-qd32:randwrite:4k:32:1 randwrite-4k-qd32x2:randwrite:4k:32:2
read-128k-seq:read:128k:8:1 write-128k-seq:write:128k:8:1"}

die() { echo "bench: error: $*"; srp-ublk del --all >/dev/null 2>&1; lab-ref-detach >/dev/null 2>&1; exit 1; }
# busy and total jiffies of the whole guest (user nice system irq softirq steal / + idle iowait)
cpu() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }

# run CASE INITIATOR ROUND DEV: one fio run; writes CASE.INITIATOR.ROUND.{json,cpu}
run() {
    _name=${1%%:*}; _rest=${1#*:}
    _rw=$(echo "$_rest" | cut -d: -f1); _bs=$(echo "$_rest" | cut -d: -f2)
    _qd=$(echo "$_rest" | cut -d: -f3); _nj=$(echo "$_rest" | cut -d: -f4)
    _f=$OUT/$_name.$2.$3
    _c0=$(cpu)
    fio --name="$_name" --filename="$4" --ioengine=libaio --direct=1 --rw="$_rw" --bs="$_bs" \
        --iodepth="$_qd" --numjobs="$_nj" --group_reporting --ramp_time=1 --runtime="$SECS" --time_based \
        --size=192m --offset_increment=32m --randrepeat=0 --norandommap --eta=never --lat_percentiles=1 \
        --output-format=json --output="$_f.json" || die "fio $_name on $2 ($4) failed"
    _c1=$(cpu)
    echo "$_c0 $_c1" > "$_f.cpu"
    echo "bench: $_name $2 round $3: $(grep -o '"iops" : [0-9.]*' "$_f.json" | head -2 | tr '\n' ' ')"
}

echo "bench: $(uname -r), $(nproc) vCPUs, rounds=$ROUNDS secs=$SECS queues=$QUEUES depth=$DEPTH scopes=$SCOPES"
{ echo "kernel=$(uname -r)"; echo "rounds=$ROUNDS"; echo "secs=$SECS"; echo "queues=$QUEUES";
  echo "depth=$DEPTH"; echo "vcpus=$(nproc)"; echo "mode_rounds=$MODE_ROUNDS"; } > "$OUT/meta"

# --- the fabric's own limit: perftest over the same rxe device, 4 KiB messages (server and client on
# the one port, as the SRP target and initiators are)
perf() {   # perf TOOL ROUND ARGS...
    _t=$1; _r=$2; shift 2
    $_t -d "$LAB_RDMA_DEV" -s 4096 "$@" >"$OUT/perftest.$_t.$_r.server" 2>&1 &
    _sp=$!
    sleep 1
    $_t -d "$LAB_RDMA_DEV" -s 4096 "$@" 10.77.0.1 >"$OUT/perftest.$_t.$_r.txt" 2>&1 ||
        { cat "$OUT/perftest.$_t.$_r.txt"; die "$_t failed"; }
    wait $_sp
    echo "bench: perftest $_t round $_r: $(grep -E '^ *[0-9]+ +[0-9]+' "$OUT/perftest.$_t.$_r.txt" | tail -1)"
}
for r in 1 2; do
    perf ib_write_bw $r -D "$SECS" -q 1
    perf ib_read_bw $r -D "$SECS"
    perf ib_send_lat $r -n 2000
done

# --- srp-ublk (default completion mode and rkey scope; with BENCH_SCOPES=login also srp-ublk with
# rkey_scope=login) against ib_srp in paired rounds, each device attached once
dev=$(srp-ublk add --target "$SRP_TARGET" --queues "$QUEUES" --depth "$DEPTH") || die "srp-ublk add failed"
devl=
case " $SCOPES " in *" login "*)
    devl=$(srp-ublk add --target "$SRP_TARGET" --queues "$QUEUES" --depth "$DEPTH" --rkey-scope login) ||
        die "srp-ublk add --rkey-scope login failed";;
esac
sd=$(lab-ref-attach "ch_count=$QUEUES,queue_size=$((DEPTH + 1))") || die "lab-ref-attach failed"
echo "bench: srp-ublk $dev (rkey_scope=command), ${devl:-no} rkey_scope=login device, ib_srp $sd ($(cat /sys/block/${sd#/dev/}/device/queue_depth 2>/dev/null) deep)"
srp-ublk list
# what each queue pins: the daemon's VmPin (tag buffers, send slots, receive buffers) over its queues
pid0=$(grep -o '"pid": *[0-9]*' "/run/srp-ublk/${dev#/dev/}.json" | grep -o '[0-9]*$')
echo "pin_kb_per_queue=$(( $(awk '/^VmPin/{print $2}' "/proc/$pid0/status") / QUEUES ))" >> "$OUT/meta"
echo "max_io_kb=$(cat "/sys/block/${dev#/dev/}/queue/max_hw_sectors_kb")" >> "$OUT/meta"
echo "poll=$(srp-ublk list --json | grep -o '"poll": *"[a-z]*"' | head -1 | grep -o '[a-z]*"$' | tr -d '"')" >> "$OUT/meta"
for r in $(seq "$ROUNDS"); do
    for c in $CASES; do
        if [ $((r % 2)) = 1 ]; then
            run "$c" srp_ublk "$r" "$dev"
            run "$c" ib_srp "$r" "$sd"
        else
            run "$c" ib_srp "$r" "$sd"
            run "$c" srp_ublk "$r" "$dev"
        fi
        [ -z "$devl" ] || run "$c" srp_ublk_login "$r" "$devl"
    done
done
srp-ublk del --all >/dev/null || die "srp-ublk del failed"

# --- srp-ublk's completion modes (ib_srp stays attached as the same-round reference)
for r in $(seq "$MODE_ROUNDS"); do
    for m in $MODES; do
        dev=$(srp-ublk add --target "$SRP_TARGET" --queues "$QUEUES" --depth "$DEPTH" --poll "$m") ||
            die "srp-ublk add --poll $m failed"
        for c in randread-4k-qd1:randread:4k:1:1 randread-4k-qd32:randread:4k:32:1; do
            run "$c" "mode-$m" "$r" "$dev"
        done
        srp-ublk del --all >/dev/null || die "srp-ublk del failed"
    done
done
lab-ref-detach >/dev/null
echo "bench: done; raw results in $OUT"
