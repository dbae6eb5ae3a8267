#!/bin/sh
# just lab-run tests/lab/examples/poll-modes.sh: 4 KiB randread QD32 for 10 s on the kernel ib_srp and on
# srp-ublk in each --poll mode, one queue each, interleaved, two rounds, in one boot.
run() { fio --name=$1 --filename=$2 --ioengine=libaio --direct=1 --rw=randread --bs=4k --iodepth=32 --runtime=10 --time_based --size=200m --eta=never --output-format=terse --terse-version=3 | awk -F';' -v n="$1" '{printf "%s IOPS=%s lat_avg_us=%s\n", n, $8, $40}'; }
sd=$(lab-ref-attach ch_count=1,queue_size=64)
for round in 1 2; do
  run ib_srp $sd
  for m in adaptive interrupt busy; do
    dev=$(srp-ublk add --target "$SRP_TARGET" --queues 1 --poll $m) || exit 1
    run srp-ublk-$m $dev
    srp-ublk del -n 0 >/dev/null
  done
done
lab-ref-detach
