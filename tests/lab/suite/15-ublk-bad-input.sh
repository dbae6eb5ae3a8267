# Bad input gives a one-line error naming cause and fix, and the exit status srp-ublk(8) gives it.
. /usr/lib/srp-lab/suite/lib.sh
trap 'show_logs; ublk_cleanup; modprobe ublk_drv 2>/dev/null' EXIT
expect_fail() { # expect_fail WHAT STATUS NEEDLE CMD...: fails with exit status STATUS, saying NEEDLE
    what=$1; want=$2; needle=$3; shift 3
    if out=$("$@" 2>&1); then fail "$what: succeeded: $out"; else rc=$?; fi
    echo "$what -> $rc: $out"
    expect_contains "$what" "$out" "$needle"
    expect_eq "$what: exit status" "$rc" "$want"
}
SG=$SRP_SERVICE_GUID
# exit statuses (srp-ublk(8)): 2 usage, 4 not found, 5 unreachable, 6 refused by the target
expect_fail "unreachable dest" 5 "unreachable" \
    srp-ublk add --timeout 3 --target "id_ext=$SG,ioc_guid=$SG,dest=10.77.9.9:5555"
expect_fail "nothing listening" 5 "no SRP target answered" \
    srp-ublk add --timeout 5 --target "id_ext=$SG,ioc_guid=$SG,dest=10.77.0.1:5556"
expect_fail "wrong ioc_guid" 6 "0x10003" \
    srp-ublk add --target "id_ext=$SG,ioc_guid=0000000000001234,dest=10.77.0.1:5555"
# a second address on the target host has no ACL: LIO rejects with channel limit reached
/usr/bin/ip addr add 10.77.0.2/24 dev dummy0 2>/dev/null
expect_fail "no ACL" 6 "0x10006" \
    srp-ublk add --target "id_ext=$SG,ioc_guid=$SG,dest=10.77.0.2:5555"
expect_fail "no ACL names the ACL" 6 "ACL for 10.77.0.2" \
    srp-ublk add --target "id_ext=$SG,ioc_guid=$SG,dest=10.77.0.2:5555"
expect_fail "bad target string" 2 "ioc_guid=xyz" srp-ublk add --target "id_ext=1,ioc_guid=xyz,dest=10.77.0.1:5555"
expect_fail "del of no device" 4 "no srp-ublk device /dev/ublkb9 (no /run/srp-ublk/ublkb9.json" srp-ublk del -n 9
expect_fail "a device name that is no device" 2 "not an srp-ublk device" srp-ublk resize -n /dev/null
! ls /dev/ublkb* >/dev/null 2>&1 || fail "a failed add left a device behind"
! pidof srp-ublk >/dev/null || fail "a failed add left a daemon behind"
/usr/sbin/modprobe -r ublk_drv || fail "cannot unload ublk_drv"
expect_fail "missing ublk_drv" 1 "modprobe ublk_drv" srp-ublk add --target "$SRP_TARGET"
/usr/sbin/modprobe ublk_drv
trap - EXIT
ublk_cleanup
