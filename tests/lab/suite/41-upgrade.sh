# `srp-ublk upgrade` (issue 23): a package upgrade replaces the binary under running daemons; the
# command has each re-execute the installed file (same pid, ublk user recovery carries the I/O
# across) under fio verify: no error, the pause reported.
. /usr/lib/srp-lab/suite/lib.sh
ublk_cleanup
trap 'show_logs; ublk_cleanup' EXIT
dev=$(ublk_add --queues 2) || fail "srp-ublk add: $dev"
id=${dev#/dev/ublkb}
pid=$(grep -o '"pid": *[0-9]*' "/run/srp-ublk/ublkb$id.json" | grep -o '[0-9]*$')
verify_start "$dev" 64m
sleep 5
# what a package upgrade does: a new file under the same name, the old one unlinked
bin=$(command -v srp-ublk)
cp "$bin" "$bin.new" && mv "$bin.new" "$bin" || fail "replacing $bin"
expect_contains "the daemon's executable before" "$(readlink /proc/$pid/exe)" "(deleted)"
for round in 1 2; do
    out=$(srp-ublk upgrade -n "$id") || fail "upgrade $round: $out"
    echo "upgrade $round: $out"
    expect_contains "upgrade $round" "$out" "runs the installed binary again"
    expect_eq "the daemon's pid after upgrade $round" \
        "$(grep -o '"pid": *[0-9]*' "/run/srp-ublk/ublkb$id.json" | grep -o '[0-9]*$')" "$pid"
    expect_eq "the daemon's executable after upgrade $round" "$(readlink /proc/$pid/exe)" "$bin"
    r=$(wait_running 30) || fail "queues not running after upgrade $round: $(queue_states)"
    sleep 5
    [ -f /tmp/fio-verify.done ] && fail "the writer stopped: $(cat /tmp/fio-verify.txt)"
done
out=$(srp-ublk upgrade --all) || fail "upgrade --all: $out"
expect_contains "upgrade --all" "$out" "$dev: daemon pid $pid runs the installed binary again"
sleep 3
verify_stop
grep -E "upgrade|is live" "$(daemon_log "$id")" | sed 's/^/daemon: /'
ok "three upgrades under fio verify, the same daemon pid, 0 errors"
trap - EXIT
ublk_cleanup
