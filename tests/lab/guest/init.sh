#!/bin/busybox sh
# /init of the lab guest (busybox ash): mount, set up the fabric and the target, run the job from the
# 9p share, write its exit status back, power off. The host side is tests/lab/lab.sh.
/bin/busybox mkdir -p /bb
/bin/busybox --install -s /bb
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/bb
export HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs tmpfs /dev/shm
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
exec </dev/console >/dev/console 2>&1
ip link set lo up 2>/dev/null || /usr/bin/ip link set lo up

finish() {   # finish RC: report RC to the host and power off
    echo "$1" > /lab/rc 2>/dev/null
    sync
    umount /lab-out 2>/dev/null; umount /lab 2>/dev/null
    poweroff -f
}

modprobe virtio_pci 2>/dev/null
if ! { /usr/sbin/modprobe 9pnet_virtio && /usr/sbin/modprobe 9p &&
       mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 lab /lab &&
       mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 labout /lab-out; }; then
    echo "lab: error: could not mount the 9p shares; the host cannot get results"
    poweroff -f
fi

. /lab/env
export LAB_OUT=/lab-out CI LAB_SETUP SRP_LUN_MB LAB_JOB_NAME LAB_ONLY
. /usr/lib/srp-lab/setup.sh

echo "lab: kernel $(uname -r), /init at uptime $(cut -d' ' -f1 /proc/uptime)s, setup=$LAB_SETUP"
if ! lab_setup > /tmp/lab-setup.log 2>&1; then
    cat /tmp/lab-setup.log
    cp /tmp/lab-setup.log "$LAB_OUT/lab-setup.log"
    echo "lab: error: the lab setup failed (log above, also in target/lab/out/lab-setup.log)"
    finish 126
fi
cp /tmp/lab-setup.log "$LAB_OUT/lab-setup.log"
[ -f /tmp/lab-env ] && . /tmp/lab-env
echo "lab: ready at uptime $(cut -d' ' -f1 /proc/uptime)s: SRP_TARGET=${SRP_TARGET:-none} SRP_LUN_BYTES=${SRP_LUN_BYTES:-0}"
echo "lab: ---- running $LAB_JOB_NAME"
cd /tmp
sh /lab/job.sh
rc=$?
echo "lab: ---- $LAB_JOB_NAME exited with status $rc"
dmesg > "$LAB_OUT/dmesg.txt" 2>/dev/null
finish $rc
