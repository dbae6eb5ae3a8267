# Inside the VM whose virtio-blk disk is srp-ublk's NBD export (tests/lab/vm/run.sh): make a file
# system, write files, record their checksums for the host, unmount (the flush reaches the export).
set -e
modprobe virtio_blk
i=0; while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -b /dev/vda ] || { echo "vm: no /dev/vda (virtio-blk on the NBD export)"; exit 1; }
echo "vm: /dev/vda is $(cat /sys/block/vda/size) sectors"
mkfs.ext4 -q -F -L srpvm /dev/vda
mkdir -p /mnt && mount -t ext4 /dev/vda /mnt
dd if=/dev/urandom of=/mnt/data.bin bs=1M count=16 2>/dev/null
echo "written by the guest at uptime $(cut -d' ' -f1 /proc/uptime)" > /mnt/hello.txt
mkdir /mnt/dir
for i in $(seq 1 50); do echo "file $i" > /mnt/dir/f$i; done
(cd /mnt && sha256sum data.bin hello.txt dir/f1 dir/f50) > "$LAB_OUT/vm-sums.txt"
sync
umount /mnt
echo "vm: ext4 made, 16 MiB and 51 files written, unmounted"
