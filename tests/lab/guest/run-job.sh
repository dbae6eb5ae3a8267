# Sourced by the guest's first process once /proc, /sys, /dev, /tmp and /run exist: /init (busybox
# ash, LAB_BOOT=init) or lab-job.service (dash under systemd, LAB_BOOT=systemd). Mounts the 9p
# shares, sets up the fabric and the target, runs the job, writes its exit status back, powers off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:${BB_PATH:-/usr/bin}
export HOME=/root

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
# a guest of a pair (lab.sh pair): the share both guests mount
if [ -n "${LAB_ROLE:-}" ]; then
    mkdir -p /lab-pair
    mount -t 9p -o trans=virtio,version=9p2000.L pair /lab-pair || echo "lab: warning: the pair's share did not mount"
fi
export LAB_OUT=/lab-out CI LAB_SETUP SRP_LUN_MB LAB_JOB_NAME LAB_ONLY LAB_BOOT LAB_ROLE
. /usr/lib/srp-lab/setup.sh

echo "lab: kernel $(uname -r), job at uptime $(cut -d' ' -f1 /proc/uptime)s, boot=$LAB_BOOT setup=$LAB_SETUP"
if [ "$LAB_SETUP" = early ]; then
    # lab-fabric.service did the setup at boot
    cp /run/lab-fabric.log /tmp/lab-setup.log 2>/dev/null
    if ! cp /run/lab-env /tmp/lab-env 2>/dev/null; then
        cat /tmp/lab-setup.log; systemctl status lab-fabric.service --no-pager
        echo "lab: error: the boot-time setup (lab-fabric.service) did not finish"
        finish 126
    fi
elif ! lab_setup > /tmp/lab-setup.log 2>&1; then
    cat /tmp/lab-setup.log
    cp /tmp/lab-setup.log "$LAB_OUT/lab-setup.log"
    echo "lab: error: the lab setup failed (log above, also in lab-setup.log of the guest's output directory)"
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
[ "$LAB_BOOT" = systemd ] && journalctl -b --no-pager > "$LAB_OUT/journal.txt" 2>/dev/null
finish $rc
