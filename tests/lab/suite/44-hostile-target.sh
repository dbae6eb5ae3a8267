# A hostile SRP target (examples/hostile_target.rs) attacks srp-ublk's buffers with the keys of
# commands that already completed: a late RDMA WRITE into a buffer a later read is using, and an
# RDMA READ of a buffer a later write is using. With rkey_scope=command (the default) each access
# fails at the target with a remote access error, the channel reconnects and the data read back is
# what was written; with rkey_scope=login the same late write lands and the data read back is
# corrupted (the test can fail), and the stale read succeeds.
. /usr/lib/srp-lab/suite/lib.sh
hostile_setup
HPID=
trap 'srp-ublk del --all >/dev/null 2>&1; [ -n "$HPID" ] && kill $HPID 2>/dev/null' EXIT

# attach SCOPE CASE: start the hostile target with CASE and attach it with SCOPE; sets DEV
attach() {
    hostile-target --listen "$HT_ADDR" --case "$2" --mib 16 2> /tmp/ht-$1-$2.err &
    HPID=$!
    _i=0; while ! grep -q listening /tmp/ht-$1-$2.err && [ $_i -lt 50 ]; do sleep 0.1; _i=$((_i + 1)); done
    DEV=$(srp-ublk add --target "$HT_TARGET,rkey_scope=$1" --queues 1 --depth 2 \
        --reconnect-delay 1 --fast-io-fail-tmo 30) || { cat /tmp/ht-$1-$2.err; fail "add ($1 $2)"; }
    echo "$1 $2: $DEV"
}
# detach SCOPE CASE: remove the device, stop the target, keep its log
detach() {
    srp-ublk del --all >/dev/null 2>&1
    kill $HPID 2>/dev/null; wait $HPID 2>/dev/null; HPID=
    cat /tmp/ht-$1-$2.err; cp /tmp/ht-$1-$2.err "$LAB_OUT/"
}
# verdict SCOPE CASE: the target's line about its attack
verdict() { grep "hostile: $2:" /tmp/ht-$1-$2.err | head -1; }

pattern /tmp/p1 4
pattern /tmp/p2 4
want1=$(sha256sum < /tmp/p1 | cut -c1-64)
want2=$(sha256sum < /tmp/p2 | cut -c1-64)

for scope in command login; do
    # late write: the first read into a buffer an earlier read completed in gets the data, then
    # garbage under the earlier read's key, then its response
    attach $scope late-write
    dd if=/tmp/p1 of="$DEV" bs=64k oflag=direct 2>/dev/null || fail "$scope: writing the pattern"
    got=$(timeout 60 dd if="$DEV" bs=64k iflag=direct 2>/dev/null | head -c 4194304 | sha256sum | cut -c1-64)
    log=$(daemon_log "${DEV#/dev/ublkb}")
    rc=$(grep -c "reconnected after" "$log")
    detach $scope late-write
    v=$(verdict $scope late-write)
    echo "$scope late-write: $v; reconnects $rc"
    case $scope in
    command)
        expect_contains "late write with a completed read's key" "$v" "refused: remote access error"
        expect_eq "data read back (command scope)" "$got" "$want1"
        [ "$rc" -ge 1 ] || { cat "$log"; fail "the channel did not reconnect after the refused access"; }
        ok "the channel reconnected and the read was re-issued: $(grep -m1 "reconnected after" "$log")" ;;
    login)
        expect_contains "late write with a completed read's key" "$v" "landed"
        [ "$got" != "$want1" ] || fail "login scope: the late write did not reach the data read back"
        ok "login scope: the late write corrupted the data read back (what command scope prevents)" ;;
    esac

    # stale read: the first write into a buffer an earlier read completed in is preceded by an
    # RDMA READ under the earlier read's key
    attach $scope stale-read
    dd if=/tmp/p1 of="$DEV" bs=64k oflag=direct 2>/dev/null || fail "$scope: writing the pattern"
    dd if="$DEV" of=/dev/null bs=64k count=8 iflag=direct 2>/dev/null || fail "$scope: reading"
    timeout 60 dd if=/tmp/p2 of="$DEV" bs=64k oflag=direct 2>/dev/null || fail "$scope: the second write"
    got=$(sha_range "$DEV" 0 4)
    detach $scope stale-read
    v=$(verdict $scope stale-read)
    echo "$scope stale-read: $v"
    case $scope in
    command) expect_contains "read with a completed read's key" "$v" "refused: remote access error" ;;
    login) expect_contains "read with a completed read's key" "$v" "landed" ;;
    esac
    expect_eq "data read back after the second write ($scope scope)" "$got" "$want2"
done
trap - EXIT
