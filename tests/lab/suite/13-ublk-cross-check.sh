# Bytes written through /dev/ublkb0 read back identical through the kernel ib_srp device, and the reverse.
. /usr/lib/srp-lab/suite/lib.sh
trap 'show_logs; ublk_cleanup' EXIT
dev=$(ublk_add) || fail "add: $dev"
sd=$(lab-ref-attach) || fail "lab-ref-attach"
ok "srp-ublk $dev and ib_srp $sd on the same LUN"
pattern /tmp/a 16
dd if=/tmp/a of="$dev" bs=1M seek=32 oflag=direct conv=fsync 2>/dev/null || fail "write via $dev"
expect_eq "srp-ublk -> ib_srp" "$(sha_range "$sd" 32 16)" "$(sha256sum < /tmp/a | cut -c1-64)"
pattern /tmp/b 16
dd if=/tmp/b of="$sd" bs=1M seek=64 oflag=direct conv=fsync 2>/dev/null || fail "write via $sd"
expect_eq "ib_srp -> srp-ublk" "$(sha_range "$dev" 64 16)" "$(sha256sum < /tmp/b | cut -c1-64)"
trap - EXIT
ublk_cleanup
