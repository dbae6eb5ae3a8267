# Every LUN: `discover --dest` lists the target's three LUNs as strings `add` takes as printed;
# `add --lun all` gives one device per LUN, all served by one daemon over the same login (none
# reconnects; 19-ublk-port-daemon tests the shared channels under load); each device
# reaches its own LUN (sizes, and data written through one is not on another); `udev-id` gives each
# device the WWN that the kernel ib_srp's sd disk of the same LUN has.
. /usr/lib/srp-lab/suite/lib.sh
ublk_cleanup
trap 'show_logs; ublk_cleanup' EXIT
out=$(srp-ublk discover --dest 10.77.0.1) || fail "discover --dest: $out"
echo "$out"
expect_eq "LUNs discovered" "$(echo "$out" | grep -c ',lun=[0-9]* #')" 3
# the guessed target port id is the lab's (EUI-64 of dummy0's MAC = srpt_service_guid)
expect_contains "discover line" "$out" "id_ext=$SRP_SERVICE_GUID,ioc_guid=$SRP_SERVICE_GUID,dest=10.77.0.1:5555,lun=1 # LIO-ORG"
line1=$(echo "$out" | grep ',lun=1 ')
d1=$(srp-ublk add --target "$line1" --queues 1) || fail "add with a discover line as printed: $d1"
expect_eq "size of LUN 1 through its discover line" "$(blockdev --getsize64 "$d1")" $((32 << 20))
srp-ublk del --all >/dev/null || fail "del"
# InfiniBand discovery has no subnet manager to ask on soft-RoCE: a clear refusal naming --dest
out=$(srp-ublk discover --ib 2>&1) && fail "discover --ib on a RoCE-only host succeeded: $out"
expect_contains "discover --ib on soft-RoCE" "$out" "rxe0 port 1 is Ethernet"
expect_contains "discover --ib on soft-RoCE" "$out" "discover --dest"
out=$(srp-ublk add --target 000000fffe770001 2>&1) && fail "add of a bare GUID on RoCE succeeded: $out"
expect_contains "add --target GUID on soft-RoCE" "$out" "bare GUID"

devs=$(ublk_add --lun all --queues 1) || fail "add --lun all: $devs"
echo "$devs"
expect_eq "devices from add --lun all" "$(echo "$devs" | wc -l)" 3
i=0
for d in $devs; do
    want=$(case $i in 0) echo "$SRP_LUN_BYTES";; 1) echo $((32 << 20));; 2) echo $((16 << 20));; esac)
    expect_eq "size of LUN $i ($d)" "$(blockdev --getsize64 "$d")" "$want"
    pattern /tmp/lun$i 4
    dd if=/tmp/lun$i of="$d" bs=1M seek=8 oflag=direct conv=fsync 2>/dev/null || fail "write $d"
    i=$((i + 1))
done
i=0
for d in $devs; do
    expect_eq "LUN $i reads back its own data" "$(sha_range "$d" 8 4)" "$(sha256sum < /tmp/lun$i | cut -c1-64)"
    i=$((i + 1))
done
expect_eq "reconnects" "$(reconnects)" 0
expect_eq "queue states" "$(queue_states)" "running running running "
js=$(srp-ublk list --json)
expect_contains "list --json" "$js" '"lun": 2'
expect_contains "list --json" "$js" '"wwid": "360014055e7a1b02'
expect_contains "list --json" "$js" '"unit": null'   # not started by systemd

# identifiers: the same WWN the kernel's sd disk of each LUN has
lab-ref-attach >/dev/null || fail "lab-ref-attach"
i=0
for d in $devs; do
    props=$(srp-ublk udev-id "$d") || fail "udev-id $d"
    sd=""
    for s in /sys/block/sd*; do
        case "$(basename "$(readlink "$s/device")")" in *:$i) sd=$s;; esac
    done
    [ -n "$sd" ] || fail "no ib_srp disk for LUN $i"
    kw=$(cat "$sd/device/wwid")   # naa.6001405...
    expect_contains "udev-id $d" "$props" "ID_WWN_WITH_EXTENSION=0x${kw#naa.}"
    expect_contains "udev-id $d" "$props" "ID_PATH=srp-$SRP_SERVICE_GUID-10.77.0.1:5555-lun-$i"
    expect_contains "udev-id $d" "$props" "ID_VENDOR=LIO-ORG"
    i=$((i + 1))
done
lab-ref-detach
wwns=$(for d in $devs; do srp-ublk udev-id "$d" | grep '^ID_WWN_WITH_EXTENSION='; done | sort -u | wc -l)
expect_eq "distinct WWNs among the three devices" "$wwns" 3
srp-ublk udev-id ublkb99 >/dev/null 2>&1 && fail "udev-id of a device srp-ublk does not serve succeeded"
ok "udev-id refuses a device srp-ublk does not serve"
trap - EXIT
ublk_cleanup
