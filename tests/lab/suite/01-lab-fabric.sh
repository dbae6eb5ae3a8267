# The lab itself: rxe is ACTIVE, ublk is there, the LIO target is enabled with the LUN mapped.
. /usr/lib/srp-lab/suite/lib.sh
[ -c /dev/ublk-control ] || fail "/dev/ublk-control missing: ublk_drv did not load"
ok "/dev/ublk-control exists"
state=$(/usr/bin/rdma link show rxe0/1)
echo "$state"
expect_contains "rdma link rxe0/1" "$state" "state ACTIVE"
ibv_devinfo -d rxe0 | grep -q PORT_ACTIVE || fail "ibv_devinfo does not show rxe0 PORT_ACTIVE"
ok "ibv_devinfo rxe0 PORT_ACTIVE"
expect_eq "tpg enable" "$(cat "$SRP_TPG/enable")" 1
[ -L "$SRP_TPG/lun/lun_0/ramdisk0" ] || fail "lun_0 is not mapped to the ramdisk"
expect_eq "RDMA/CM listener port" "$(cat /sys/kernel/config/target/srpt/discovery_auth/rdma_cm_port)" 5555
expect_eq "srpt_service_guid (fixed MAC)" "$SRP_SERVICE_GUID" 000000fffe770001
