# At boot, with the RDMA port present early (lab-fabric.service makes rxe0 and LIO's target before
# network-online.target, as an HCA's driver at coldplug would) and srp-ublk@boot enabled, the target's
# device is live before remote-fs-pre.target: the unit pulls that passive target in and is ordered
# before it, so a remote (_netdev) mount finds its disk. Without Wants=remote-fs-pre.target the target
# is never reached at boot and this test fails.
. /usr/lib/srp-lab/suite/lib.sh
U=srp-ublk@boot.service
ts() { systemctl show -P ActiveEnterTimestampMonotonic "$1"; }
expect_eq "$U" "$(systemctl is-active $U)" active
f=$(ts lab-fabric.service); a=$(ts $U); b=$(ts remote-fs-pre.target); m=$(ts multi-user.target)
echo "active at (monotonic us): lab-fabric $f, $U $a, remote-fs-pre.target $b, multi-user.target $m"
[ "${b:-0}" -gt 0 ] || fail "remote-fs-pre.target was never reached at boot: nothing pulled it in"
[ "${a:-0}" -gt 0 ] && [ "$a" -le "$b" ] || fail "$U became active after remote-fs-pre.target"
ok "$U active (its device live) $(((b - a) / 1000)) ms before remote-fs-pre.target"
systemd-analyze critical-chain remote-fs-pre.target --no-pager 2>&1 | head -20
dev=$(srp-ublk list | grep -o '^/dev/ublkb[0-9]*' | head -1)
[ -n "$dev" ] && [ -b "$dev" ] || fail "no srp-ublk device after boot: $(srp-ublk list 2>&1)"
n=$(srp-ublk list | grep -c '^/dev/ublkb')
expect_eq "devices after boot" "$n" 1
pattern /tmp/p 4
dd if=/tmp/p of="$dev" bs=1M oflag=direct 2>/dev/null || fail "writing $dev"
expect_eq "data read back from $dev" "$(sha_range "$dev" 0 4)" "$(sha256sum < /tmp/p | cut -c1-64)"
# the port unit that udev started for rxe0 at boot left the enabled unit alone: one daemon
expect_eq "daemons" "$(pgrep -c -f -- ' add --')" 1
