#!/bin/sh
# The lab half of `just bench counters`: srp-ublk and the kernel's ib_srp on the same LIO LUN in one
# boot, in paired rounds (each round runs both, alternating which goes first), with the counters that
# move less than time does: system calls, context switches and CPU time of srp-ublk's daemon (perf stat
# on its pid) and the whole guest's CPU time (/proc/stat) per I/O. Raw files go to $LAB_OUT/counters/;
# tests/lab/bench/counters.py makes the table (per-round ratios, their median and range).
#
# Knobs (the host prepends them): BENCH_ROUNDS (5), BENCH_SECS (10, after 1 s ramp), BENCH_QUEUES (2),
# BENCH_DEPTH (64), BENCH_CASES, BENCH_SCOPES (the rkey scopes srp-ublk runs with, "command login"),
# BENCH_POLLS (other completion modes srp-ublk runs with, default scope: e.g. "interrupt busy"),
# BENCH_RUBLK (set by run.sh: rublk's null target against srp-ublk's null backend), BENCH_PROFILE,
# BENCH_BASELINE_NAME (set by run.sh for BENCH_BASELINE=BINARY: that binary as srp_ublk_baseline).
set -u
ROUNDS=${BENCH_ROUNDS:-5}
SECS=${BENCH_SECS:-10}
QUEUES=${BENCH_QUEUES:-2}
DEPTH=${BENCH_DEPTH:-64}
OUT=$LAB_OUT/counters
rm -rf "$OUT"; mkdir -p "$OUT"
# name rw bs iodepth numjobs
CASES=${BENCH_CASES:-"randread-4k-qd1:randread:4k:1:1 randwrite-4k-qd1:randwrite:4k:1:1
randread-4k-qd32:randread:4k:32:1 randwrite-4k-qd32:randwrite:4k:32:1"}

die() { echo "counters: error: $*"; srp-ublk del --all >/dev/null 2>&1; lab-ref-detach >/dev/null 2>&1; exit 1; }
cpu() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' "${1:-/proc/stat}"; }
# the target guest's CPU line, when it is a guest of its own (lab.sh pair): it copies its
# /proc/stat to the share both guests mount every 0.2 s
TSTAT=/lab-pair/stat
# pkts: RoCE packets sent and received so far on this guest's port (rxe's port counters; in one
# guest both ends' packets pass through it)
pkts() { rdma statistic show link "$LAB_RDMA_DEV/1" | tr ' ' '\n' |
         awk 'prev == "sent_pkts" {s = $1} prev == "rcvd_pkts" {r = $1} {prev = $1} END {print s + 0, r + 0}'; }
# tcpu: the target guest's CPU line (read again if it was caught between truncation and write)
tcpu() {
    for _i in 1 2 3 4 5 6 7 8 9 10; do
        _v=$(cpu "$TSTAT"); [ -n "$_v" ] && { echo "$_v"; return; }; sleep 0.05
    done
    die "the target guest's CPU line $TSTAT stays empty"
}
# daemon_pid DEV: the pid in srp-ublk's state file for DEV
daemon_pid() { grep -o '"pid": *[0-9]*' "/run/srp-ublk/${1#/dev/}.json" | grep -o '[0-9]*$'; }
# note_pin NAME PID: what that daemon pins per queue, into meta
note_pin() { echo "pin_kb_per_queue_$1=$(( $(awk '/^VmPin/{print $2}' "/proc/$2/status") / QUEUES ))" >> "$OUT/meta"; }

# ctx PID: the voluntary and involuntary context switches of PID's threads so far
ctx() { cat /proc/"$1"/task/*/status 2>/dev/null |
        awk '/^voluntary_ctxt/{v+=$2} /^nonvoluntary_ctxt/{n+=$2} END{print v+0, n+0}'; }
# run CASE INITIATOR ROUND DEV [PID]: one fio run, perf stat on PID (srp-ublk's daemon) alongside;
# writes CASE.INITIATOR.ROUND.{json,cpu,pkts,perf,ctx} (and tcpu in a pair)
run() {
    _name=${1%%:*}; _rest=${1#*:}
    _rw=$(echo "$_rest" | cut -d: -f1); _bs=$(echo "$_rest" | cut -d: -f2)
    _qd=$(echo "$_rest" | cut -d: -f3); _nj=$(echo "$_rest" | cut -d: -f4)
    _f=$OUT/$_name.$2.$3
    _pp=
    if [ -n "${5:-}" ]; then
        # counts the whole run, ramp included; fio's I/O count below includes the ramp too
        perf stat -x, -e raw_syscalls:sys_enter,context-switches,task-clock -p "$5" -o "$_f.perf" &
        _pp=$!
        sleep 0.2
    fi
    _k0=$(pkts)
    _c0=$(cpu)
    [ -r "$TSTAT" ] && _t0=$(tcpu)
    [ -z "$_pp" ] || _x0=$(ctx "$5")
    fio --name="$_name" --filename="$4" --ioengine=libaio --direct=1 --rw="$_rw" --bs="$_bs" \
        --iodepth="$_qd" --numjobs="$_nj" --group_reporting --runtime="$SECS" --time_based \
        --size=192m --offset_increment=32m --randrepeat=0 --norandommap --eta=never --lat_percentiles=1 \
        --output-format=json --output="$_f.json" || die "fio $_name on $2 ($4) failed"
    _c1=$(cpu)
    [ -r "$TSTAT" ] && echo "$_t0 $(tcpu)" > "$_f.tcpu"
    echo "$_k0 $(pkts)" > "$_f.pkts"
    if [ -n "$_pp" ]; then
        echo "$_x0 $(ctx "$5")" > "$_f.ctx"
        kill -INT "$_pp"; wait "$_pp"
    fi
    echo "$_c0 $_c1" > "$_f.cpu"
    echo "counters: $_name $2 round $3: $(grep -o '"iops" : [0-9.]*' "$_f.json" | head -2 | tr '\n' ' ')"
}

echo "counters: $(uname -r), $(nproc) vCPUs, rounds=$ROUNDS secs=$SECS queues=$QUEUES depth=$DEPTH"
{ echo "kernel=$(uname -r)"; echo "rounds=$ROUNDS"; echo "secs=$SECS"; echo "queues=$QUEUES";
  echo "depth=$DEPTH"; echo "vcpus=$(nproc)"; echo "version=$(srp-ublk --version)"
  [ "${LAB_ROLE:-}" = initiator ] && echo "lab=two guests: LIO in a guest of its own (lab.sh pair)"; } > "$OUT/meta"
# the fabric's own limit on the same device: perftest's 4 KiB ib_write_bw message rate (2 runs), its
# server where the target is (the target guest of a pair, else this guest), with each guest's CPU
PAIR=; [ "${LAB_ROLE:-}" = initiator ] && PAIR=1
for r in 1 2; do
    _f=$OUT/perftest.ib_write_bw.$r
    if [ -n "$PAIR" ]; then
        lab-target serve ib_write_bw -s 4096 -D "$SECS" -q 1 || die "no perftest server in the target guest"
    else
        ib_write_bw -d "$LAB_RDMA_DEV" -s 4096 -D "$SECS" -q 1 > "$_f.server" 2>&1 &
        sleep 1
    fi
    _k0=$(pkts); _c0=$(cpu); [ -r "$TSTAT" ] && _t0=$(tcpu)
    ib_write_bw -d "$LAB_RDMA_DEV" -s 4096 -D "$SECS" -q 1 10.77.0.1 > "$_f.txt" 2>&1 ||
        { cat "$_f.txt"; die "ib_write_bw failed"; }
    echo "$_c0 $(cpu)" > "$_f.cpu"; [ -r "$TSTAT" ] && echo "$_t0 $(tcpu)" > "$_f.tcpu"
    echo "$_k0 $(pkts)" > "$_f.pkts"
    wait
    echo "counters: perftest ib_write_bw run $r: $(grep -E '^ *[0-9]+ +[0-9]+' "$_f.txt" | tail -1)"
done
# srp-ublk with each rkey scope (BENCH_SCOPES, default "command login"): srp_ublk is the default
# (command: a memory window per command), srp_ublk_login the login-wide registration
SCOPES=${BENCH_SCOPES:-"command login"}
inis=
for scope in $SCOPES; do
    d=$(srp-ublk add --target "$SRP_TARGET" --queues "$QUEUES" --depth "$DEPTH" --rkey-scope "$scope") ||
        die "srp-ublk add --rkey-scope $scope failed"
    p=$(daemon_pid "$d")
    [ -n "$p" ] || die "no daemon pid in /run/srp-ublk/${d#/dev/}.json"
    name=srp_ublk; [ "$scope" = command ] || name=srp_ublk_$scope
    inis="$inis $name:$d:$p"
    note_pin "$name" "$p"
    echo "counters: srp-ublk rkey_scope=$scope $d (daemon $p) as $name"
done
# srp-ublk with other completion modes (BENCH_POLLS, e.g. "interrupt busy"; default scope), as
# srp_ublk_poll_MODE
for mode in ${BENCH_POLLS:-}; do
    d=$(srp-ublk add --target "$SRP_TARGET" --queues "$QUEUES" --depth "$DEPTH" --poll "$mode") ||
        die "srp-ublk add --poll $mode failed"
    p=$(daemon_pid "$d")
    [ -n "$p" ] || die "no daemon pid in /run/srp-ublk/${d#/dev/}.json"
    inis="$inis srp_ublk_poll_$mode:$d:$p"
    note_pin "srp_ublk_poll_$mode" "$p"
    echo "counters: srp-ublk --poll $mode $d (daemon $p) as srp_ublk_poll_$mode"
done
if [ -n "${BENCH_BASELINE_NAME:-}" ] || [ "${BENCH_RUBLK:-0}" = 1 ]; then
    mkdir -p /mnt/baseline
    mount -t 9p -o trans=virtio,version=9p2000.L baseline /mnt/baseline || die "mounting the baseline share"
fi
# the ublk front end alone: srp-ublk's null backend against rublk's null target (the peer of
# srp_ublk_null), same queues and depth, no fabric
if [ "${BENCH_RUBLK:-0}" = 1 ]; then
    R=/mnt/baseline/rublk
    echo "version_rublk=$($R --version)" >> "$OUT/meta"
    d=$(srp-ublk add --backend null:1G --queues "$QUEUES" --depth "$DEPTH") || die "srp-ublk add --backend null failed"
    p=$(daemon_pid "$d")
    inis="$inis srp_ublk_null:$d:$p"
    echo "counters: srp-ublk --backend null:1G $d (daemon $p) as srp_ublk_null"
    before=$(ls /dev/ublkb* 2>/dev/null)
    $R add null -q "$QUEUES" -d "$DEPTH" >"$OUT/rublk-add.txt" 2>&1 || { cat "$OUT/rublk-add.txt"; die "rublk add null failed"; }
    RD=
    for x in $(ls /dev/ublkb* 2>/dev/null); do echo "$before" | grep -qx "$x" || RD=$x; done
    [ -n "$RD" ] || { cat "$OUT/rublk-add.txt"; die "rublk add null made no /dev/ublkbN"; }
    inis="$inis rublk_null:$RD:"
    echo "counters: rublk ($($R --version)) null $RD as rublk_null"
fi
# an older srp-ublk binary (BENCH_BASELINE on the host), with its defaults
if [ -n "${BENCH_BASELINE_NAME:-}" ]; then
    B=/mnt/baseline/srp-ublk
    echo "version_baseline=$($B --version)" >> "$OUT/meta"
    d=$($B add --target "$SRP_TARGET" --queues "$QUEUES" --depth "$DEPTH") || die "baseline add failed"
    p=$(daemon_pid "$d")
    inis="$inis srp_ublk_baseline:$d:$p"; BD=$d
    echo "counters: baseline srp-ublk ($($B --version)) $d (daemon $p) as srp_ublk_baseline"
fi
sd=$(lab-ref-attach "ch_count=$QUEUES,queue_size=$((DEPTH + 1))") || die "lab-ref-attach failed"
inis="$inis ib_srp:$sd:"
echo "counters: ib_srp $sd"
# each round runs every initiator, starting one further along the list than the round before
n=$(echo $inis | wc -w)
for r in $(seq "$ROUNDS"); do
    for c in $CASES; do
        i=0
        while [ $i -lt "$n" ]; do
            e=$(echo $inis | cut -d' ' -f$(( (r + i) % n + 1 )))
            ini=${e%%:*}; rest=${e#*:}
            run "$c" "$ini" "$r" "${rest%%:*}" "${rest#*:}"
            i=$((i + 1))
        done
    done
done
# one more run per case and initiator under a whole-guest profile (lab-prof: perf cpu-clock on every
# CPU with call chains; TCG has no PMU): counters.py splits the guest's CPU by where each sample
# landed (initiator, fabric, target, fio, scheduler), a sample taken where interrupts came back on
# charged to the holder of the lock. BENCH_PROFILE=0 skips it.
if [ "${BENCH_PROFILE:-1}" != 0 ]; then
    for c in $CASES; do
        for e in $inis; do
            ini=${e%%:*}; rest=${e#*:}
            name=${c%%:*}
            # the target guest of a pair profiles itself over the same window
            _tp=
            if [ -n "$PAIR" ]; then
                # its window holds fio's run: from its first sample to 2 s after
                lab-target prof "$((SECS + 3))" "$name.$ini" &
                _tp=$!
                _i=0
                while [ ! -e "/lab-pair/$name.$ini.recording" ]; do
                    [ $_i -lt 300 ] || die "the target guest's profile of $name $ini did not start"
                    sleep 0.1; _i=$((_i + 1))
                done
                rm -f "/lab-pair/$name.$ini.recording"
            fi
            lab-prof record "$((SECS + 1))" /tmp/prof.data &
            _rp=$!
            sleep 0.5
            run "$c" "$ini" prof "${rest%%:*}"
            wait "$_rp"
            if [ -n "$_tp" ]; then
                wait "$_tp" || die "the target guest's profile of $name $ini failed"
                mv "/lab-pair/$name.$ini.samples" "$OUT/$name.$ini.tprof.samples"
                mv "/lab-pair/$name.$ini.modules" "$OUT/tprof.modules"
            fi
            lab-prof fold /tmp/prof.data > "$OUT/$name.$ini.prof.samples" && [ -s "$OUT/$name.$ini.prof.samples" ] ||
                die "no profile of $name $ini (lab-prof fold /tmp/prof.data)"
        done
    done
fi
lab-prof modules > "$OUT/prof.modules" || die "lab-prof modules failed"
[ -n "${RD:-}" ] && { $R del -n "${RD#/dev/ublkb}" >/dev/null 2>&1 || die "rublk del failed"; }
[ -n "${BD:-}" ] && { $B del -n "${BD#/dev/ublkb}" >/dev/null || die "baseline del failed"; }
srp-ublk del --all >/dev/null || die "srp-ublk del failed"
lab-ref-detach >/dev/null
echo "counters: done; raw results in $OUT"
