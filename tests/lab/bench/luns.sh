#!/bin/sh
# The lab half of `just bench luns`: 8 LUNs on one target port (the lab's three and five 16 MiB
# ramdisks mapped for this), each with fio at QD4 at once, in paired rounds (each round runs every
# initiator, starting one further along the list than the round before):
#   srp_ublk           `srp-ublk add --lun all`: one daemon, the port's channels shared by the LUNs
#   srp_ublk_baseline  the same command from an older binary (BENCH_BASELINE on the host; before
#                      issue 46 it started a daemon per LUN, each with channels of its own)
#   ib_srp             the kernel's initiator on the same port (ch_count = queues), its 8 sd disks
# For each: the I/Os fio made, the guest's CPU time (/proc/stat), the QPs the initiator holds
# (`rdma res show qp`) and the memory its daemons pinned (VmPin). luns.py makes the table.
#
# Knobs (the host prepends them): BENCH_ROUNDS (5), BENCH_SECS (10, after 1 s ramp), BENCH_QUEUES
# (2), BENCH_DEPTH (64), BENCH_BASELINE_NAME (set by run.sh for BENCH_BASELINE=BINARY).
set -u
ROUNDS=${BENCH_ROUNDS:-5}
SECS=${BENCH_SECS:-10}
QUEUES=${BENCH_QUEUES:-2}
DEPTH=${BENCH_DEPTH:-64}
OUT=$LAB_OUT/luns
rm -rf "$OUT"; mkdir -p "$OUT"
. /usr/lib/srp-lab/setup.sh
EXTRA="3 4 5 6 7"

die() { echo "luns: error: $*"; srp-ublk del --all >/dev/null 2>&1; lab-ref-detach >/dev/null 2>&1; exit 1; }
cpu() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
# pins PIDS: the memory those processes (comma-separated) pinned, in KiB
pins() { for p in $(echo "$1" | tr ',' ' '); do awk '/^VmPin/{print $2}' "/proc/$p/status"; done | awk '{s+=$1} END{print s+0}'; }
# qps PIDS: the QPs those processes own; qps_kernel: the QPs no process owns (the kernel's). ib_srp's
# are half of those its logins add: in one guest, each login adds ib_srpt's QP for it as well
qps() { for p in $(echo "$1" | tr ',' ' '); do /usr/bin/rdma res show qp | grep -cE "pid $p( |$)"; done | awk '{s+=$1} END{print s+0}'; }
qps_kernel() { /usr/bin/rdma res show qp | grep -vc ' pid '; }
# daemons DEVS: the daemons' pids named by those devices' state files, comma-separated
daemons() {
    for d in $1; do grep -o '"pid": *[0-9]*' "/run/srp-ublk/${d#/dev/}.json" | grep -o '[0-9]*$'; done | sort -u | paste -sd,
}

for l in $EXTRA; do
    rd=$CFG/core/rd_mcp_0/ramdisk$l
    mkdir -p "$rd" && echo "rd_pages=$((16 * 256))" > "$rd/control" && echo 1 > "$rd/enable" &&
        lab_unit_serial "$rd" $l && lab_map_lun "$SRP_TPG" $LAB_IP $l "$rd" || die "mapping LUN $l"
done
echo "luns: $(uname -r), $(nproc) vCPUs, rounds=$ROUNDS secs=$SECS queues=$QUEUES depth=$DEPTH, 8 LUNs x fio QD4"
{ echo "kernel=$(uname -r)"; echo "rounds=$ROUNDS"; echo "secs=$SECS"; echo "queues=$QUEUES"
  echo "depth=$DEPTH"; echo "vcpus=$(nproc)"; echo "version=$(srp-ublk --version)"; } > "$OUT/meta"

# each initiator: name, its 8 devices in LUN order, the daemons' pids ("" for the kernel)
devs=$(srp-ublk add --target "$SRP_TARGET" --lun all --queues "$QUEUES" --depth "$DEPTH") ||
    die "srp-ublk add --lun all failed"
[ "$(echo "$devs" | wc -l)" = 8 ] || die "srp-ublk add --lun all gave $(echo "$devs" | wc -l) devices, not 8"
devs=$(echo $devs)
pids=$(daemons "$devs")
inis="srp_ublk"
echo "srp_ublk $devs" > "$OUT/devices"
echo "srp_ublk pids=$pids qps=$(qps "$pids") pinned_kib=$(pins "$pids")" >> "$OUT/meta"
if [ -n "${BENCH_BASELINE_NAME:-}" ]; then
    mkdir -p /mnt/baseline
    mount -t 9p -o trans=virtio,version=9p2000.L baseline /mnt/baseline || die "mounting the baseline share"
    B=/mnt/baseline/srp-ublk
    echo "version_baseline=$($B --version)" >> "$OUT/meta"
    bdevs=$($B add --target "$SRP_TARGET" --lun all --queues "$QUEUES" --depth "$DEPTH") ||
        die "baseline add --lun all failed"
    [ "$(echo "$bdevs" | wc -l)" = 8 ] || die "baseline add --lun all gave $(echo "$bdevs" | wc -l) devices"
    bdevs=$(echo $bdevs)
    bpids=$(daemons "$bdevs")
    inis="$inis srp_ublk_baseline"
    echo "srp_ublk_baseline $bdevs" >> "$OUT/devices"
    echo "srp_ublk_baseline pids=$bpids qps=$(qps "$bpids") pinned_kib=$(pins "$bpids")" >> "$OUT/meta"
fi
k0=$(qps_kernel)
lab-ref-attach "ch_count=$QUEUES,queue_size=$((DEPTH + 1))" >/dev/null || die "lab-ref-attach failed"
udevadm settle 2>/dev/null
sds=
for l in 0 1 2 3 4 5 6 7; do
    for s in /sys/block/sd*; do
        [ "$(basename "$(readlink "$s/device")" | sed 's/.*://')" = $l ] && sds="$sds /dev/$(basename "$s")"
    done
done
sds=$(echo $sds)
[ "$(echo $sds | wc -w)" = 8 ] || die "ib_srp gave $(echo $sds | wc -w) disks for 8 LUNs: $sds"
inis="$inis ib_srp"
echo "ib_srp $sds" >> "$OUT/devices"
echo "ib_srp qps=$((($(qps_kernel) - k0) / 2)) pinned_kib=0" >> "$OUT/meta"
cat "$OUT/meta"

# run INI ROUND: fio on the initiator's 8 devices at once, QD4 random 4 KiB reads and writes
run() {
    _f=$OUT/$1.$2
    _jobs=
    for d in $(grep "^$1 " "$OUT/devices" | cut -d' ' -f2-); do
        _jobs="$_jobs --name=${d#/dev/} --filename=$d"
    done
    _c0=$(cpu)
    # shellcheck disable=SC2086
    fio --ioengine=libaio --direct=1 --rw=randrw --rwmixread=70 --bs=4k --iodepth=4 \
        --runtime="$SECS" --ramp_time=1 --time_based --size=8m --randrepeat=0 --norandommap \
        --eta=never --group_reporting --output-format=json --output="$_f.json" $_jobs ||
        die "fio on $1 failed"
    echo "$_c0 $(cpu)" > "$_f.cpu"
    echo "luns: $1 round $2: $(grep -o '"iops" : [0-9.]*' "$_f.json" | head -2 | tr '\n' ' ')"
}
n=$(echo $inis | wc -w)
for r in $(seq "$ROUNDS"); do
    i=0
    while [ $i -lt "$n" ]; do
        run "$(echo $inis | cut -d' ' -f$(( (r + i) % n + 1 )))" "$r"
        i=$((i + 1))
    done
done
[ -n "${BENCH_BASELINE_NAME:-}" ] && { for d in $bdevs; do $B del -n "${d#/dev/ublkb}" >/dev/null; done; }
srp-ublk del --all >/dev/null || die "srp-ublk del failed"
lab-ref-detach >/dev/null
echo "luns: done; raw results in $OUT"
