# Bytes written through /dev/ublkb0 read back identical through the kernel ib_srp device, and the reverse.
. /usr/lib/srp-lab/suite/lib.sh
trap 'show_logs; ublk_cleanup' EXIT
dev=$(ublk_add) || fail "add: $dev"
sd=$(lab-ref-attach) || fail "lab-ref-attach"
ok "srp-ublk $dev and ib_srp $sd on the same LUN"
cross_check "$dev" "$sd"
trap - EXIT
ublk_cleanup
