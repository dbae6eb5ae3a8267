#!/bin/sh
# just lab-run tests/lab/examples/max-io.sh: 1 MiB and 128 KiB sequential I/O on srp-ublk with the
# default largest I/O, on srp-ublk with max_sect=1024 (512 KiB commands) and on ib_srp, the three
# devices on the same LUN in one boot, 4 rounds (docs/bench/performance-record.md, "The default largest I/O with
# the pool"). Prints MiB/s and the guest's CPU jiffies per GiB for each run.
set -u
SECS=8; ROUNDS=${ROUNDS:-4}
cpu() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
a=$(srp-ublk add --target "$SRP_TARGET" --queues 2 --depth 64) || { echo "add a failed: $a"; exit 1; }
b=$(srp-ublk add --target "$SRP_TARGET,max_sect=1024" --queues 2 --depth 64) || { echo "add b failed: $b"; exit 1; }
sd=$(lab-ref-attach "ch_count=2,queue_size=65") || { echo "ref failed"; exit 1; }
for d in $a $b $sd; do n=${d#/dev/}; echo "$d max_sectors_kb=$(cat /sys/block/$n/queue/max_sectors_kb) max_hw=$(cat /sys/block/$n/queue/max_hw_sectors_kb)"; done
for r in $(seq 1 $ROUNDS); do
  for c in read:1m:4 write:1m:4 read:128k:8 write:128k:8; do
    rw=${c%%:*}; rest=${c#*:}; bs=${rest%%:*}; qd=${rest#*:}
    for d in $a $b $sd; do
      c0=$(cpu)
      line=$(fio --name=x --filename=$d --ioengine=libaio --direct=1 --rw=$rw --bs=$bs --iodepth=$qd \
        --ramp_time=1 --runtime=$SECS --time_based --size=192m --eta=never --minimal)
      c1=$(cpu)
      echo "$line" | awk -F';' -v r=$r -v c=$rw-$bs-qd$qd -v d=${d#/dev/} -v j=$((c1-c0)) -v s=$SECS \
        '{bw=($7+$48)/1024; printf "round %s %s %s: MiB/s %.1f jiffies %d jiffies/GiB %.0f\n", r, c, d, bw, j, j/(bw*(s+1)/1024)}'
    done
  done
done
srp-ublk del --all; lab-ref-detach
