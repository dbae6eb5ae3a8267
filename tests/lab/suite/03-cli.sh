# The srp-ublk binary runs in the guest and reads the lab's target string the way ib_srp does.
. /usr/lib/srp-lab/suite/lib.sh
srp-ublk --version || fail "srp-ublk --version"
out=$(srp-ublk target parse "$SRP_TARGET") || fail "srp-ublk target parse '$SRP_TARGET': $out"
echo "$out"
expect_contains "parsed target" "$out" "target_port_id: ${SRP_SERVICE_GUID}${SRP_SERVICE_GUID}"
expect_contains "parsed target" "$out" "dest: 10.77.0.1:5555"
js=$(srp-ublk target parse --json "$SRP_TARGET") || fail "srp-ublk target parse --json: $js"
expect_contains "target parse --json" "$js" "\"target_port_id\": \"${SRP_SERVICE_GUID}${SRP_SERVICE_GUID}\""
expect_contains "target parse --json" "$js" '"dest": "10.77.0.1:5555"'
# a bad string: non-zero exit and a message that quotes the bad token
if bad=$(srp-ublk target parse "id_ext=$SRP_SERVICE_GUID,ioc_guid=zz,dest=10.77.0.1:5555" 2>&1); then
    fail "a bad ioc_guid was accepted: $bad"
fi
echo "$bad"
expect_contains "error for a bad ioc_guid" "$bad" "ioc_guid=zz"
# features, as text and as JSON: the lab's soft-RoCE device, its port up, the modules loaded
txt=$(srp-ublk features) || fail "srp-ublk features"
expect_contains "features" "$txt" "rdma device rxe0"
json=$(srp-ublk features --json) || fail "srp-ublk features --json"
echo "$json" | grep -q '"name": "rxe0"' || fail "features --json names no rxe0: $json"
echo "$json" | grep -q '"state": "4: ACTIVE"' || fail "features --json: rxe0's port is not ACTIVE: $json"
echo "$json" | grep -q '"control": true' || fail "features --json: no /dev/ublk-control: $json"
ok "features --json: rxe0 ACTIVE, ublk control present"
