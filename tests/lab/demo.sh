#!/bin/sh
# just demo: srp-ublk logs in to the lab's LIO SRP target over soft-RoCE, serves the LUN as
# /dev/ublkb0, and fio runs on it with verification; then the device is deleted cleanly.
set -e
echo "== the fabric: soft-RoCE"; /usr/bin/rdma link show
echo "== the target: LIO ib_srpt, ramdisk LUN, RDMA/CM port 5555"; ls "$SRP_TPG/lun/lun_0"
echo "== srp-ublk features"; srp-ublk features
echo "== srp-ublk add --target \"$SRP_TARGET\" --queues 2"
dev=$(srp-ublk add --target "$SRP_TARGET" --queues 2)
echo "live: $dev ($(($(cat /sys/block/${dev#/dev/}/size) / 2048)) MiB)"
srp-ublk list
echo "== fio: 4k random read/write, QD16, 2 jobs, crc32c verify, 15 s"
fio --name=demo --filename="$dev" --ioengine=libaio --direct=1 --rw=randrw --bs=4k --iodepth=16 \
    --numjobs=2 --size=64m --offset_increment=64m --runtime=15 --time_based \
    --verify=crc32c --verify_backlog=512 --verify_fatal=1 --group_reporting --eta=never --output=/tmp/demo-fio.txt
grep -E 'IOPS|lat \(usec\).*avg|err=' /tmp/demo-fio.txt
echo "== the same bytes through the kernel's ib_srp (the reference initiator)"
sd=$(lab-ref-attach)
a=$(dd if="$dev" bs=1M count=16 iflag=direct 2>/dev/null | sha256sum | cut -c1-16)
b=$(dd if="$sd" bs=1M count=16 iflag=direct 2>/dev/null | sha256sum | cut -c1-16)
echo "sha256 of the first 16 MiB: srp-ublk $a, ib_srp $b"
[ "$a" = "$b" ]
lab-ref-detach
srp-ublk list
echo "== srp-ublk del -n 0"; srp-ublk del -n 0
echo "== demo done: srp-ublk served the SRP LUN as $dev and fio verified it"
