#!/bin/sh
# just demo: the lab's SRP target, seen and used. (Issue 4 turns this into srp-ublk attaching the LUN.)
set -e
echo "== soft-RoCE"; /usr/bin/rdma link show
echo "== LIO SRP target"; echo "target port group: $SRP_TPG"; ls -l "$SRP_TPG/lun/lun_0" "$SRP_TPG/acls"
echo "== the target string srp-ublk and ib_srp take"; echo "$SRP_TARGET"
srp-ublk target parse "$SRP_TARGET"
echo "== the reference initiator (kernel ib_srp) attaches the LUN"
dev=$(lab-ref-attach); echo "attached: $dev ($(($(cat /sys/block/${dev#/dev/}/size) / 2048)) MiB)"
fio --name=demo --filename="$dev" --ioengine=libaio --direct=1 --rw=randrw --bs=4k --iodepth=16 \
    --size=32m --runtime=5 --time_based --verify=crc32c --do_verify=1 --output-format=normal | \
    grep -E 'IOPS|err=|verify'
lab-ref-detach
echo "== demo done"
