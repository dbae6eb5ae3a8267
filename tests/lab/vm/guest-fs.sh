# Inside the VM of tests/lab/vm/run.sh, whose virtio-blk disk is srp-ublk's NBD export and whose
# vhost-user-blk disk is the fake target's file: on each, make a file system, write files, record
# their checksums for the host, unmount (the flush reaches the server).
set -e
modprobe virtio_blk
i=0; while { [ ! -b /dev/vda ] || [ ! -b /dev/vdb ]; } && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -b /dev/vda ] && [ -b /dev/vdb ] || { echo "vm: FAIL: not two virtio disks: $(ls /sys/block)"; exit 1; }
# the vhost-user-blk disk answers GET_ID with its LUN's serial; the NBD one has none
vhost=; nbd=
for d in vda vdb; do
    if [ "$(cat /sys/block/$d/serial 2>/dev/null)" = SRPFAKE0001 ]; then vhost=$d; else nbd=$d; fi
done
[ -n "$vhost" ] && [ -n "$nbd" ] ||
    { echo "vm: FAIL: no disk with the serial the vhost-user-blk server answers (GET_ID): vda '$(cat /sys/block/vda/serial)', vdb '$(cat /sys/block/vdb/serial)'"; exit 1; }
echo "vm: vhost-user-blk disk $vhost: $(ls /sys/block/$vhost/mq | wc -l) queue(s), $(cat /sys/block/$vhost/size) sectors" | tee "$LAB_OUT/vm-vhost.txt"
# fs NAME DEV: ext4 on DEV, 16 MiB and 51 files written, their checksums in vm-sums-NAME.txt
fs() {
    echo "vm: $1 disk /dev/$2 is $(cat /sys/block/$2/size) sectors"
    mkfs.ext4 -q -F -L "srp$1" /dev/$2
    mkdir -p /mnt/$1 && mount -t ext4 /dev/$2 /mnt/$1
    dd if=/dev/urandom of=/mnt/$1/data.bin bs=1M count=16 2>/dev/null
    echo "written by the guest at uptime $(cut -d' ' -f1 /proc/uptime)" > /mnt/$1/hello.txt
    mkdir /mnt/$1/dir
    for i in $(seq 1 50); do echo "file $i" > /mnt/$1/dir/f$i; done
    (cd /mnt/$1 && sha256sum data.bin hello.txt dir/f1 dir/f50) > "$LAB_OUT/vm-sums-$1.txt"
    sync
    umount /mnt/$1
    echo "vm: $1: ext4 made, 16 MiB and 51 files written, unmounted"
}
fs nbd $nbd
fs vhost $vhost
