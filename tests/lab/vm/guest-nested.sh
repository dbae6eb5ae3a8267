# In the lab guest (tests/lab/vm/nested.sh): attach LIO's LUN 0 with srp-ublk and boot a VM (QEMU,
# TCG) on /dev/ublkb0; then check the file system and files the VM left there.
. /usr/lib/srp-lab/suite/lib.sh
mkdir -p /mnt/nested /mnt/d
mount -t 9p -o trans=virtio,version=9p2000.L nested /mnt/nested || fail "mounting the nested share"
DEV=$(ublk_add --queues 2) || fail "srp-ublk add"
echo "lab guest: $DEV over $SRP_TARGET"
N=/mnt/nested
echo "lab guest: the VM's disk: $(sed "s|/dev/ublkb0|$DEV|" $N/qemu-disk-opts)"
t0=$(now)
timeout 1200 $N/lib/ld-linux-x86-64.so.2 --library-path $N/lib $N/qemu-system-x86_64 \
    -L $N/firmware -accel tcg -cpu max -m 256M -machine pc -nodefaults -no-reboot \
    -display none -monitor none -serial file:/tmp/inner.log -nic none \
    -kernel $N/vmlinuz -initrd $N/initrd.gz \
    -append "console=ttyS0 rdinit=/init panic=-1 loglevel=3 mitigations=off quiet" \
    $(sed "s|/dev/ublkb0|$DEV|" $N/qemu-disk-opts) > /tmp/inner-qemu.log 2>&1
rc=$?
took=$(since "$t0")
cat /tmp/inner.log
echo "lab guest: the inner VM ran ${took} s (qemu exit $rc)"
echo "the inner VM (TCG under TCG) on $DEV booted, made ext4, wrote 8 MiB + 21 files and powered off in ${took} s" > "$LAB_OUT/nested-time.txt"
[ "$rc" = 0 ] || fail "inner qemu: $(cat /tmp/inner-qemu.log)"
grep -q "inner: unmounted" /tmp/inner.log || fail "the inner VM did not finish its job"
sed -n '/SUMS-BEGIN/,/SUMS-END/p' /tmp/inner.log | grep -v SUMS | sed 's/\r$//' > /tmp/sums.txt
[ "$(wc -l < /tmp/sums.txt)" = 4 ] || fail "the inner VM printed no checksums"
e2fsck -fn "$DEV" > /tmp/fsck.log 2>&1 || { cat /tmp/fsck.log; fail "e2fsck of $DEV after the VM"; }
ok "e2fsck of $DEV: clean"
mount -t ext4 -o ro "$DEV" /mnt/d || fail "mounting $DEV"
(cd /mnt/d && sha256sum -c /tmp/sums.txt) || fail "files on $DEV differ from what the VM wrote"
ok "4 files on $DEV match the VM's checksums"
umount /mnt/d
srp-ublk del --all
