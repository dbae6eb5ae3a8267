#!/bin/busybox sh
# /init of the lab guest with LAB_BOOT=init (busybox ash, no init system): mount the kernel's file
# systems, then run-job.sh does the rest. The host side is tests/lab/lab.sh.
/bin/busybox mkdir -p /bb
/bin/busybox --install -s /bb
export BB_PATH=/bb PATH=/usr/sbin:/usr/bin:/bb
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs tmpfs /dev/shm
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
exec </dev/console >/dev/console 2>&1
ip link set lo up 2>/dev/null || /usr/bin/ip link set lo up
. /usr/lib/srp-lab/run-job.sh
