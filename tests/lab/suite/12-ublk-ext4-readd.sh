# mkfs.ext4 on /dev/ublkb0, mount, write files, unmount, del, add again, mount: checksums match.
. /usr/lib/srp-lab/suite/lib.sh
trap 'umount /mnt 2>/dev/null; show_logs; ublk_cleanup' EXIT
dev=$(ublk_add) || fail "add: $dev"
mkfs.ext4 -q -F "$dev" || fail "mkfs.ext4"
mount -t ext4 "$dev" /mnt || fail "mount"
for i in 1 2 3 4; do dd if=/dev/urandom of=/mnt/f$i bs=64k count=$((i * 16)) 2>/dev/null; done
(cd /mnt && sha256sum f1 f2 f3 f4) > /tmp/sums
sync
umount /mnt || fail "umount"
srp-ublk del -n 0 || fail "del"
dev=$(ublk_add) || fail "second add: $dev"
mount -t ext4 -o ro "$dev" /mnt || fail "mount after re-add"
(cd /mnt && sha256sum -c /tmp/sums) || fail "checksums differ after del + add"
ok "4 files intact across del + add"
umount /mnt
trap - EXIT
ublk_cleanup
