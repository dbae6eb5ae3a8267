# One daemon per target port: `add --lun all` at 2 queues gives the port's three LUNs three devices
# served by one daemon over 2 channels (2 logins at ib_srpt, 2 QPs), each device's I/O reaching its
# own LUN. Under crc32c-verified writes on every device: `del` of one device leaves the others
# writing; `kill -9` of the daemon and `recover --all` take the others over together in one new
# daemon; `upgrade --all` moves them to a new image of the daemon. No verify error anywhere.
. /usr/lib/srp-lab/suite/lib.sh
ublk_cleanup
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
trap 'killall fio 2>/dev/null; show_logs; ublk_cleanup' EXIT
n0=$(dmesg | grep -c 'Received SRP_LOGIN_REQ')
devs=$(ublk_add --lun all --queues 2) || fail "add --lun all: $devs"
echo "$devs"
expect_eq "devices from add --lun all" "$(echo "$devs" | wc -l)" 3
expect_eq "srp-ublk daemons serving them" "$(pidof srp-ublk | wc -w)" 1
# one login lists the LUNs (REPORT LUNS), then the port's 2 channels: not 2 per LUN
expect_eq "logins seen by ib_srpt (the LUN listing's, then the port's channels)" \
    "$(($(dmesg | grep -c 'Received SRP_LOGIN_REQ') - n0))" 3
expect_eq "QPs owned by srp-ublk" "$(/usr/bin/rdma res show qp | grep -c srp-ublk)" 2
pids=$(cat /run/srp-ublk/ublkb*.json | grep -o '"pid": *[0-9]*' | sort -u | wc -l)
expect_eq "daemons named by the state files" "$pids" 1
set -- $devs
d0=$1 d1=$2 d2=$3
expect_eq "size of LUN 0 ($d0)" "$(blockdev --getsize64 "$d0")" "$SRP_LUN_BYTES"
expect_eq "size of LUN 1 ($d1)" "$(blockdev --getsize64 "$d1")" $((32 << 20))
expect_eq "size of LUN 2 ($d2)" "$(blockdev --getsize64 "$d2")" $((16 << 20))
i=0
for d in $devs; do
    pattern /tmp/lun$i 2
    dd if=/tmp/lun$i of="$d" bs=1M seek=12 oflag=direct conv=fsync 2>/dev/null || fail "write $d"
    i=$((i + 1))
done
i=0
for d in $devs; do
    expect_eq "LUN $i reads back its own data" "$(sha_range "$d" 12 2)" "$(sha256sum < /tmp/lun$i | cut -c1-64)"
    i=$((i + 1))
done

vstart 0 "$d0" 8m
vstart 1 "$d1" 8m
vstart 2 "$d2" 8m
sleep 6
# del of one device under load: its writer fails (its disk went away), the others go on
out=$(srp-ublk del -n "${d2#/dev/ublkb}") || fail "del of $d2: $out"
[ -b "$d2" ] && fail "$d2 still there after del"
[ -f "/run/srp-ublk/ublkb${d2#/dev/ublkb}.json" ] && fail "$d2's state file still there"
_i=0; while [ ! -f /tmp/v2.done ] && [ $_i -lt 300 ]; do sleep 0.1; _i=$((_i + 1)); done
expect_eq "writer 2 ended with its device" "$([ -f /tmp/v2.done ] && echo yes)" yes
expect_eq "daemons after del of one device" "$(pidof srp-ublk | wc -w)" 1
sleep 4
for n in 0 1; do [ -f "/tmp/v$n.done" ] && { cat "/tmp/v$n.txt"; fail "writer $n stopped with $d2's del"; }; done
ok "the other devices' writers go on after del of $d2"
expect_eq "queue states" "$(queue_states)" "running running running running "

# kill -9 and recover --all: one new daemon takes both devices over
pid=$(pidof srp-ublk)
kill -9 "$pid" || fail "cannot kill the daemon $pid"
sleep 3
for n in 0 1; do [ -f "/tmp/v$n.done" ] && fail "writer $n stopped while the daemon was dead: $(cat "/tmp/v$n.txt")"; done
out=$(srp-ublk recover --all) || fail "recover --all: $out"
echo "$out"
expect_eq "devices recovered" "$(echo "$out" | grep -c /dev/ublkb)" 2
expect_eq "daemons after recover --all" "$(pidof srp-ublk | wc -w)" 1
expect_eq "QPs owned by srp-ublk after recover" "$(/usr/bin/rdma res show qp | grep -c srp-ublk)" 2
for d in "$d0" "$d1"; do wait_io "$d" 60 >/dev/null || fail "no I/O on $d within 60 s of the recovery"; done
sleep 4

# upgrade --all: the same daemon moves both devices to a new image
pid=$(pidof srp-ublk)
out=$(srp-ublk upgrade --all) || fail "upgrade --all: $out"
echo "$out"
expect_eq "daemon after upgrade (same pid)" "$(pidof srp-ublk)" "$pid"
for d in "$d0" "$d1"; do wait_io "$d" 60 >/dev/null || fail "no I/O on $d within 60 s of the upgrade"; done
sleep 4
vstop 0
vstop 1
expect_eq "queue states at the end" "$(queue_states)" "running running running running "
srp-ublk del --all >/dev/null || fail "del --all"
pidof srp-ublk >/dev/null && fail "a daemon is left after del --all"
ls /dev/ublkb* 2>/dev/null && fail "devices left after del --all"
ok "del --all removed every device and the daemon"
trap - EXIT
ublk_cleanup
