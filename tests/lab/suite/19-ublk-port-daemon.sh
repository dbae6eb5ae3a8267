# One daemon per target port, with the port exporting 8 LUNs (the lab's three and five 8 MiB
# ramdisks mapped for this test): `add --lun all` at 2 queues gives 8 devices served by one daemon
# over 2 channels (2 logins at ib_srpt, 2 QPs), each device's I/O reaching its own LUN. Under
# crc32c-verified writes on every device: a link flap and a target drop (each reconnects the port's
# 2 channels, not one per LUN); `del` of one device leaves the others writing; `kill -9` of the
# daemon and `recover --all` take the others over together in one new daemon; `upgrade --all`
# moves them to a new image of the daemon; a LUN mapped at run time, and the LUN whose device was
# deleted, join the running daemon and its 2 channels with `add --lun all`; a LUN unmapped under
# load fails its own device's I/O only. No verify error anywhere else.
. /usr/lib/srp-lab/suite/lib.sh
. /usr/lib/srp-lab/setup.sh
ublk_cleanup
EXTRA="3 4 5 6 7"
add_luns() {
    for l in $EXTRA; do
        rd=$CFG/core/rd_mcp_0/ramdisk$l
        mkdir -p "$rd" && echo "rd_pages=$((8 * 256))" > "$rd/control" && echo 1 > "$rd/enable" &&
            lab_unit_serial "$rd" $l && lab_map_lun "$SRP_TPG" $LAB_IP $l "$rd" || return 1
    done
}
remove_luns() {
    for l in $EXTRA 8; do
        lab_unmap_lun "$SRP_TPG" $LAB_IP $l ramdisk$l 2>/dev/null
        rmdir "$CFG/core/rd_mcp_0/ramdisk$l" 2>/dev/null
    done
    true
}
logins() { dmesg | grep -c 'Received SRP_LOGIN_REQ'; }
qps() { /usr/bin/rdma res show qp | grep -c srp-ublk; }
# vstart N DEV SIZE / vstop N: a verified writer per device (as verify_start / verify_stop)
vstart() {
    rm -f "/tmp/v$1.done"
    ( fio --name=v$1 --filename="$2" --ioengine=io_uring --direct=1 --rw=randwrite --bsrange=4k-64k \
        --iodepth=8 --size="$3" --loops=1000 --time_based --runtime=3600 \
        --verify=crc32c --verify_backlog=128 --verify_fatal=1 --do_verify=1 \
        --output="/tmp/v$1.txt" & echo $! > "/tmp/v$1.pid"; wait $!; echo $? > "/tmp/v$1.done" ) &
}
vstop() {
    [ -f "/tmp/v$1.done" ] && { cat "/tmp/v$1.txt"; fail "writer $1 stopped early (exit $(cat "/tmp/v$1.done"))"; }
    kill -INT "$(cat "/tmp/v$1.pid")" 2>/dev/null
    _i=0; while [ ! -f "/tmp/v$1.done" ] && [ $_i -lt 2400 ]; do sleep 0.1; _i=$((_i + 1)); done
    [ -f "/tmp/v$1.done" ] || { stuck_dump; fail "writer $1 did not stop within 240 s"; }
    cp "/tmp/v$1.txt" "$LAB_OUT/19-ublk-port-daemon-fio$1.txt"
    fio_verified "/tmp/v$1.txt"
    ok "writer $1: 0 errors, $(grep -o 'WRITE: bw=[^,]*, [^,]*, io=[^ ,]*' "/tmp/v$1.txt" | sed 's/.*io=//') verified"
}
trap 'killall fio 2>/dev/null; ip link set dummy0 up; echo 1 > "$SRP_TPG/enable"; show_logs; ublk_cleanup; remove_luns' EXIT
add_luns || fail "mapping LUNs $EXTRA on the lab target"
n0=$(logins)
devs=$(ublk_add --lun all --queues 2 --reconnect-delay 2) || fail "add --lun all: $devs"
echo "$devs"
expect_eq "devices from add --lun all" "$(echo "$devs" | wc -l)" 8
expect_eq "srp-ublk daemons serving them" "$(pidof srp-ublk | wc -w)" 1
# one login lists the LUNs (REPORT LUNS), then the port's 2 channels: not 2 per LUN
expect_eq "logins seen by ib_srpt (the LUN listing's, then the port's channels)" "$(($(logins) - n0))" 3
expect_eq "QPs owned by srp-ublk" "$(qps)" 2
pids=$(cat /run/srp-ublk/ublkb*.json | grep -o '"pid": *[0-9]*' | sort -u | wc -l)
expect_eq "daemons named by the state files" "$pids" 1
set -- $devs
expect_eq "size of LUN 0 ($1)" "$(blockdev --getsize64 "$1")" "$SRP_LUN_BYTES"
expect_eq "size of LUN 1 ($2)" "$(blockdev --getsize64 "$2")" $((32 << 20))
expect_eq "size of LUN 2 ($3)" "$(blockdev --getsize64 "$3")" $((16 << 20))
expect_eq "size of LUN 7 ($8)" "$(blockdev --getsize64 "$8")" $((8 << 20))
i=0
for d in $devs; do
    pattern /tmp/lun$i 2
    dd if=/tmp/lun$i of="$d" bs=1M seek=4 oflag=direct conv=fsync 2>/dev/null || fail "write $d"
    i=$((i + 1))
done
i=0
for d in $devs; do
    expect_eq "LUN $i reads back its own data" "$(sha_range "$d" 4 2)" "$(sha256sum < /tmp/lun$i | cut -c1-64)"
    i=$((i + 1))
done

d0=$(echo "$devs" | head -1)
log=$(daemon_log "${d0#/dev/ublkb}")
[ -f "$log" ] || fail "no log file for the port's daemon: '$log'"
i=0
for d in $devs; do vstart $i "$d" 8m; i=$((i + 1)); done
sleep 6
# a link flap and a target drop: the port's 2 channels log in again, once each, for all 8 LUNs
for fault in "link flap" "target drop"; do
    q0=$(qps)
    lines0=$(wc -l < "$log")
    # the logins that count are those once the fault ends (a disabled target port refuses some)
    case $fault in
        "link flap") ip link set dummy0 down; sleep 8; l0=$(logins); ip link set dummy0 up ;;
        "target drop") echo 0 > "$SRP_TPG/enable"; sleep 6; l0=$(logins); echo 1 > "$SRP_TPG/enable" ;;
    esac
    r=$(wait_running 60) || { thread_dump; fail "$fault: queues not running 60 s after it: $(queue_states)"; }
    for d in $devs; do wait_io "$d" 60 >/dev/null || fail "$fault: no I/O on $d within 60 s"; done
    n=$(($(logins) - l0))
    echo "$fault: every queue running $r s after it ended, $n login(s) at ib_srpt since"
    [ "$n" -ge 2 ] && [ "$n" -le 4 ] || fail "$fault: $n logins at ib_srpt (want the port's 2 channels, a retry at most each; one per LUN would be 16)"
    expect_eq "QPs owned by srp-ublk after the $fault" "$(qps)" "$q0"
    # ib_srp's order: queue 0 first with SINGLE (the target ends what it kept of the old
    # channels), then queue 1 with MULTI
    after=$(tail -n +"$((lines0 + 1))" "$log")
    echo "$after" | grep -q "logging in with SINGLE" || fail "$fault: queue 0 did not log in with SINGLE: $(echo "$after" | tail -20)"
    expect_eq "$fault: the queues in the order they logged in again" \
        "$(echo "$after" | grep -o 'queue [0-9]*: reconnected' | cut -d: -f1 | tr '\n' ',')" "queue 0,queue 1,"
    echo "$fault: ib_srpt closed $(dmesg | grep -c 'Relogin - closed existing channel') stale channel(s) on SINGLE logins so far"
    for n in 0 1 2 3 4 5 6 7; do [ -f "/tmp/v$n.done" ] && { cat "/tmp/v$n.txt"; fail "writer $n stopped in the $fault"; }; done
    ok "$fault: 8 devices back over 2 channels, every writer going on"
    sleep 4
done

# del of one device under load: its writer fails (its disk went away), the others go on
d7=$8
out=$(srp-ublk del -n "${d7#/dev/ublkb}") || fail "del of $d7: $out"
[ -b "$d7" ] && fail "$d7 still there after del"
[ -f "/run/srp-ublk/ublkb${d7#/dev/ublkb}.json" ] && fail "$d7's state file still there"
_i=0; while [ ! -f /tmp/v7.done ] && [ $_i -lt 300 ]; do sleep 0.1; _i=$((_i + 1)); done
expect_eq "writer 7 ended with its device" "$([ -f /tmp/v7.done ] && echo yes)" yes
expect_eq "daemons after del of one device" "$(pidof srp-ublk | wc -w)" 1
sleep 4
for n in 0 1 2 3 4 5 6; do [ -f "/tmp/v$n.done" ] && { cat "/tmp/v$n.txt"; fail "writer $n stopped with $d7's del"; }; done
ok "the other devices' writers go on after del of $d7"
expect_eq "queues running" "$(queue_states | wc -w) $(queue_states | tr ' ' '\n' | grep -c '^running$')" "14 14"
set -- $devs
live="$1 $2 $3 $4 $5 $6 $7"

# kill -9 and recover --all: one new daemon takes the 7 devices over together
pid=$(pidof srp-ublk)
kill -9 "$pid" || fail "cannot kill the daemon $pid"
sleep 3
for n in 0 1 2 3 4 5 6; do [ -f "/tmp/v$n.done" ] && fail "writer $n stopped while the daemon was dead: $(cat "/tmp/v$n.txt")"; done
out=$(srp-ublk recover --all) || fail "recover --all: $out"
echo "$out"
expect_eq "devices recovered" "$(echo "$out" | grep -c /dev/ublkb)" 7
expect_eq "daemons after recover --all" "$(pidof srp-ublk | wc -w)" 1
expect_eq "QPs owned by srp-ublk after recover" "$(qps)" 2
for d in $live; do wait_io "$d" 60 >/dev/null || fail "no I/O on $d within 60 s of the recovery"; done
sleep 4

# upgrade --all: the same daemon moves the 7 devices to a new image
pid=$(pidof srp-ublk)
out=$(srp-ublk upgrade --all) || fail "upgrade --all: $out"
echo "$out"
expect_eq "daemon after upgrade (same pid)" "$(pidof srp-ublk)" "$pid"
# one signal moved the daemon's 7 devices: one new image, not one per device
log=$(daemon_log "${d0#/dev/ublkb}")
expect_eq "re-executions in the daemon's log ($log)" "$(grep -c 'go over to the binary' "$log")" 1
for d in $live; do wait_io "$d" 60 >/dev/null || fail "no I/O on $d within 60 s of the upgrade"; done
sleep 4

# a 9th LUN mapped at run time: `add --lun all` gives it, and LUN 7 (its device deleted above), a
# device each from the running daemon, over the port's same 2 channels
rd=$CFG/core/rd_mcp_0/ramdisk8
mkdir -p "$rd" && echo "rd_pages=$((8 * 256))" > "$rd/control" && echo 1 > "$rd/enable" &&
    lab_unit_serial "$rd" 8 && lab_map_lun "$SRP_TPG" $LAB_IP 8 "$rd" || fail "mapping LUN 8"
t=$(now)
out=$(ublk_add --lun all --queues 2 2>/tmp/join.err) || fail "add --lun all to the running daemon: $out $(cat /tmp/join.err)"
echo "$out"; cat /tmp/join.err
echo "LUNs 7 and 8 joined in $(since "$t") s (the LUN listing's login, the daemon's re-execution)"
expect_contains "add --lun all with the port's daemon running" "$(cat /tmp/join.err)" "joins the port's daemon (pid $pid"
expect_eq "devices the running daemon took on" "$(echo "$out" | grep -c /dev/ublkb)" 2
expect_eq "daemon after the join (same pid)" "$(pidof srp-ublk)" "$pid"
expect_eq "QPs owned by srp-ublk after the join" "$(qps)" 2
expect_eq "state files naming the daemon" "$(grep -l "\"pid\": *$pid," /run/srp-ublk/ublkb*.json | wc -l)" 9
set -- $out
expect_eq "size of the joined LUN 8 ($2)" "$(blockdev --getsize64 "$2")" $((8 << 20))
again=$(ublk_add --lun 8 2>&1) && fail "a second device for LUN 8: $again"
expect_contains "add of a LUN the daemon serves" "$again" "LUN 8 of this target port is $2 already"
vstart 7 "$1" 8m
vstart 8 "$2" 8m
for d in $live $1 $2; do wait_io "$d" 60 >/dev/null || fail "no I/O on $d within 60 s of the join"; done
sleep 4

# LUN 6 goes away on the target under load: its device's I/O fails (LOGICAL UNIT NOT SUPPORTED),
# the port's other devices and their channels go on
set -- $live
d6=$7
lab_unmap_lun "$SRP_TPG" $LAB_IP 6 ramdisk6 || fail "unmapping LUN 6"
_i=0; while [ ! -f /tmp/v6.done ] && [ $_i -lt 300 ]; do sleep 0.1; _i=$((_i + 1)); done
expect_eq "writer 6 ended with its LUN" "$([ -f /tmp/v6.done ] && echo yes)" yes
dd if="$d6" of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null && fail "a read of $d6 succeeded with its LUN gone"
expect_eq "daemon with LUN 6 gone (same pid)" "$(pidof srp-ublk)" "$pid"
sleep 4
for n in 0 1 2 3 4 5 7 8; do [ -f "/tmp/v$n.done" ] && { cat "/tmp/v$n.txt"; fail "writer $n stopped when LUN 6 went away"; }; done
ok "LUN 6 gone: $d6 fails its I/O, the other devices' writers go on"
for n in 0 1 2 3 4 5 7 8; do vstop $n; done
expect_eq "queues running at the end" "$(queue_states | tr ' ' '\n' | grep -c '^running$')" 18
srp-ublk del --all >/dev/null || fail "del --all"
pidof srp-ublk >/dev/null && fail "a daemon is left after del --all"
ls /dev/ublkb* 2>/dev/null && fail "devices left after del --all"
ok "del --all removed every device and the daemon"
remove_luns
trap - EXIT
ublk_cleanup
