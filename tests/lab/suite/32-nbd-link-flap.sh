# NBD over the SRP LUN through link flaps: the rxe netdev down 8 s, 3 times, under fio's nbd engine
# writing with crc32c verify. Each connection's channel holds its I/O, reconnects when the link is
# back (reconnect_delay 2 s) and re-issues what it held, with the write data copied to the new
# login's buffers; fio sees no error and verifies everything. Requests up to 256 KiB: those over
# 128 KiB go through the connection's four staging buffers (and wait for one), held with them.
. /usr/lib/srp-lab/suite/lib.sh
trap 'ip link set dummy0 up; kill $SRV 2>/dev/null; killall -9 fio 2>/dev/null; tail -n 30 /tmp/serve.err' EXIT
SOCK=/run/srp-ublk/flap.sock
nbd_serve $SOCK flap --queues 2 --reconnect-delay 2 --fast-io-fail-tmo 90
URI="nbd+unix:///flap?socket=$SOCK"
rm -f /tmp/fio-nbd.done
( fio --name=nv --ioengine=nbd --uri="$URI" --rw=randwrite --bsrange=4k-256k --iodepth=16 --size=64m \
    --time_based --runtime=3600 --verify=crc32c --verify_backlog=256 --verify_fatal=1 --do_verify=1 \
    --output=/tmp/fio-nbdflap.txt; echo $? > /tmp/fio-nbd.done ) &
sleep 5
reconnected() { grep -c "reconnected after" /tmp/serve.err; }
c=1
while [ $c -le 3 ]; do
    r0=$(reconnected)
    ip link set dummy0 down; sleep 8; ip link set dummy0 up
    t=$(now); i=0
    while [ "$(reconnected)" -le "$r0" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    [ "$(reconnected)" -gt "$r0" ] || fail "flap $c: the NBD connection's channel did not reconnect within 60 s"
    [ -f /tmp/fio-nbd.done ] && { cat /tmp/fio-nbdflap.txt; fail "fio stopped during flap $c"; }
    echo "flap $c: the NBD connection's channel reconnected $(since "$t") s after the link came back"
    sleep 4
    c=$((c + 1))
done
killall -INT fio
i=0; while [ ! -f /tmp/fio-nbd.done ] && [ $i -lt 2400 ]; do sleep 0.1; i=$((i + 1)); done
[ -f /tmp/fio-nbd.done ] || { nbd_stuck_dump /tmp/fio-nbdflap.txt; fail "fio did not stop within 240 s of SIGINT"; }
cat /tmp/fio-nbdflap.txt; cp /tmp/fio-nbdflap.txt "$LAB_OUT/fio-nbd-flap.txt"
fio_verified /tmp/fio-nbdflap.txt
ok "fio over NBD: 0 errors through 3 link flaps, $(grep -o 'WRITE: bw=[^,]*, [^,]*, io=[^ ,]*' /tmp/fio-nbdflap.txt | sed 's/.*io=//') written and verified"
grep "reconnected after" /tmp/serve.err | tail -3
