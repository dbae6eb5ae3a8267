#!/bin/sh
# /init of the VM inside the lab guest (tests/lab/vm/nested.sh): its virtio-blk disk is /dev/ublkb0
# of the lab guest. Makes ext4, writes files, prints their checksums between markers on the
# console, unmounts and powers off.
export PATH=/bin:/sbin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in crc16 mbcache jbd2 crc32c_generic ext4 virtio_blk; do
    [ -e /mods/$m.ko ] && insmod /mods/$m.ko
done
i=0; while [ ! -b /dev/vda ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if [ -b /dev/vda ]; then
    echo "inner: /dev/vda is $(cat /sys/block/vda/size) sectors, uptime $(cut -d' ' -f1 /proc/uptime)"
    /sbin/mke2fs -q -t ext4 -F -L srpvm /dev/vda && mount -t ext4 /dev/vda /mnt && {
        dd if=/dev/urandom of=/mnt/data.bin bs=1M count=8 2>/dev/null
        echo "written by the VM inside the lab guest" > /mnt/hello.txt
        mkdir /mnt/dir
        for i in $(seq 1 20); do echo "file $i" > /mnt/dir/f$i; done
        echo "inner: SUMS-BEGIN"
        (cd /mnt && sha256sum data.bin hello.txt dir/f1 dir/f20)
        echo "inner: SUMS-END"
        sync; umount /mnt && echo "inner: unmounted, uptime $(cut -d' ' -f1 /proc/uptime)"
    }
else
    echo "inner: no /dev/vda"
fi
poweroff -f
