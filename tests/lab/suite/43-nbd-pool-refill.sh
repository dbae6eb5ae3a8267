# An NBD export keeps serving new connections after more channel losses than it has channels
# (issue 20): one channel (--queues 1), two outages past fast_io_fail_tmo with a client's I/O
# failing and the client leaving while the channel is down (the channel is dropped); once the link
# is back, a new connection logs a new channel in: qemu-io and a verified fio run succeed.
# Before, every new client was told "every SRP channel is in use" for good.
. /usr/lib/srp-lab/suite/lib.sh
trap 'ip link set dummy0 up; kill $SRV 2>/dev/null; killall -9 fio 2>/dev/null; tail -n 30 /tmp/serve.err' EXIT
SOCK=/run/srp-ublk/refill.sock
nbd_serve $SOCK refill --queues 1 --reconnect-delay 2 --fast-io-fail-tmo 4
URI="nbd+unix:///refill?socket=$SOCK"
# served: a client's connection gets a channel, as a client that retries would find (the first login
# after the link came back can time out); prints the attempts it took
served() {
    _n=1
    while ! nbdinfo "$URI" >/dev/null 2>&1; do
        [ $_n -ge 15 ] && return 1
        sleep 2; _n=$((_n + 1))
    done
    echo $_n
}
for round in 1 2; do
    n=$(served) || fail "round $round: no connection served within 30 s: $(tail -3 /tmp/serve.err)"
    echo "round $round: a connection was served (attempt $n)"
    fio --name=out --ioengine=nbd --uri="$URI" --rw=randread --bs=4k --iodepth=4 --size=32m \
        --time_based --runtime=120 --output=/tmp/fio-out$round.txt > /dev/null 2>&1 &
    fp=$!
    sleep 3
    ip link set dummy0 down
    # fast_io_fail_tmo (4 s) fails the held reads: fio stops and leaves while the channel is down
    i=0; while kill -0 $fp 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    kill -0 $fp 2>/dev/null && fail "round $round: fio did not stop after fast_io_fail_tmo"
    wait $fp && fail "round $round: fio saw no error through an outage past fast_io_fail_tmo"
    sleep 1
    ip link set dummy0 up
    # the RDMA port follows its netdev a moment later; a login before that fails at once
    i=0; while ! grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state && [ $i -lt 300 ]; do
        sleep 0.1; i=$((i + 1)); done
    echo "round $round: the client left during the outage; port $(cat /sys/class/infiniband/rxe0/ports/1/state)"
    sleep 1
done
grep -c "channel is dropped" /tmp/serve.err | grep -q '^[2-9]' ||
    fail "the channel was not dropped twice: $(grep -i 'dropped\|NBD' /tmp/serve.err | tail -5)"
n=$(served) || fail "no connection served within 30 s of the link coming back: $(tail -3 /tmp/serve.err)"
echo "after the second loss: a connection was served (attempt $n)"
out=$(qemu-io --image-opts "driver=nbd,server.type=unix,server.path=$SOCK,export=refill" -c "read 0 64k" 2>&1) ||
    fail "qemu-io after two channel losses: $out"
expect_contains "qemu-io after two channel losses" "$out" "read 65536/65536 bytes at offset 0"
fio --name=v --ioengine=nbd --uri="$URI" --rw=randwrite --bs=4k --iodepth=8 --size=16m \
    --verify=crc32c --verify_fatal=1 --output=/tmp/fio-v.txt || { cat /tmp/fio-v.txt; fail "fio verify after the losses"; }
grep -q 'err= 0' /tmp/fio-v.txt || fail "fio reported errors"
expect_contains "serve's log" "$(cat /tmp/serve.err)" "a new SRP channel logged in for a connection"
ok "served again after 2 losses of its only channel: $(grep -c 'new SRP channel logged in' /tmp/serve.err) new login(s)"
kill $SRV; wait $SRV 2>/dev/null
trap - EXIT
