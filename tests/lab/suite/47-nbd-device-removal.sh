# The RDMA device under an NBD export is removed and added back under a client (issue 20): the
# server replaces its image (same pid) so that `rdma link delete` finishes at once (before, it hung
# in the kernel for as long as the server ran: librdmacm keeps every device it has used open until
# the process image ends), binds its socket again and serves the export once the device is back.
# qemu-io, a real QEMU NBD client with reconnect-delay, writes, idles across the removal, writes
# again and reads both back; then qemu-img convert writes 64 MiB across a second removal, and the
# data is read back through ib_srp.
. /usr/lib/srp-lab/suite/lib.sh
. /usr/lib/srp-lab/setup.sh
SOCK=/run/srp-ublk/rm.sock
QIO=
trap 'lab_port_restore; kill $SRV $QIO 2>/dev/null; tail -n 30 /tmp/serve.err' EXIT
mkdir -p /run/srp-ublk
# remove_rxe0 WHEN: rdma link delete rxe0 in the background (a hung one cannot be killed and would
# hang this test), failing after 30 s; then LIO's port on it is taken apart
remove_rxe0() {
    _t=$(now)
    rdma link delete rxe0 & _rdel=$!
    _i=0; while kill -0 $_rdel 2>/dev/null && [ $_i -lt 300 ]; do sleep 0.1; _i=$((_i + 1)); done
    kill -0 $_rdel 2>/dev/null && fail "rdma link delete rxe0 ($1) still hangs after 30 s with the NBD server running"
    wait $_rdel || fail "rdma link delete rxe0 ($1) failed"
    echo "rdma link delete rxe0 ($1) finished in $(since "$_t") s"
    lab_target_port_remove "$SRP_TPG"
}
nbd_serve $SOCK rm --queues 2 --reconnect-delay 1 --fast-io-fail-tmo 60
pid=$SRV
OPTS="driver=nbd,server.type=unix,server.path=$SOCK,export=rm,reconnect-delay=60"
out=$(qemu-io --image-opts "$OPTS" -c "write -P 0x61 0 1M" 2>&1) || fail "the first write: $out"
# a client connected across the removal: it idles, then writes and reads both writes back
qemu-io --image-opts "$OPTS" -c "sleep 12000" -c "write -P 0x62 1M 1M" \
    -c "read -P 0x61 0 1M" -c "read -P 0x62 1M 1M" > /tmp/qio.out 2>&1 &
QIO=$!
i=0; while [ "$(ss -x | grep -c rm.sock)" -lt 1 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
sleep 1
ss -x | grep rm.sock || fail "qemu-io did not connect"
remove_rxe0 "with a client connected"
sleep 2
lab_port_back || fail "bringing the port back"
t=$(now)
wait $QIO; rc=$?; QIO=
cat /tmp/qio.out
echo "qemu-io ended $(since "$t") s after the port came back (rc $rc)"
expect_eq "qemu-io exit status" "$rc" 0
case "$(cat /tmp/qio.out)" in *failed*|*error*) fail "qemu-io saw an error";; esac
expect_contains "qemu-io" "$(cat /tmp/qio.out)" "wrote 1048576/1048576 bytes at offset 1048576"
expect_contains "qemu-io" "$(cat /tmp/qio.out)" "read 1048576/1048576 bytes at offset 1048576"
kill -0 $pid 2>/dev/null || fail "the server (pid $pid) is gone"
expect_eq "the server's pid after the removal" "$(pidof srp-ublk)" "$pid"
grep -q "is being removed: serving the export from a new image" /tmp/serve.err ||
    fail "the server did not say it handed over"
expect_eq "images that served the export" "$(grep -c "serving NBD export 'rm'" /tmp/serve.out)" 2
ok "$(grep -m1 "serving LUN 0 again" /tmp/serve.err)"

# under I/O: qemu-img convert writes 64 MiB into the export at 8 MiB/s while rxe0 is deleted and
# added back; what it wrote is read back through ib_srp
pattern /tmp/p64 64
qemu-img convert -n -r 8M -f raw /tmp/p64 --target-image-opts "$OPTS" > /tmp/conv.out 2>&1 &
CONV=$!
sleep 3
remove_rxe0 "under I/O"
kill -0 $CONV 2>/dev/null || fail "qemu-img convert ended before the port came back: $(cat /tmp/conv.out)"
sleep 2
lab_port_back || fail "bringing the port back under I/O"
t=$(now)
wait $CONV; rc=$?
echo "qemu-img convert ended $(since "$t") s after the port came back (rc $rc): $(cat /tmp/conv.out)"
expect_eq "qemu-img convert exit status" "$rc" 0
expect_eq "the server's pid after a removal under I/O" "$(pidof srp-ublk)" "$pid"
expect_eq "images that served the export" "$(grep -c "serving NBD export 'rm'" /tmp/serve.out)" 3
# the data through ib_srp, after the server is gone
kill $SRV; wait $SRV 2>/dev/null; SRV=
dev=$(lab-ref-attach) || fail "lab-ref-attach"
expect_eq "the 64 MiB qemu-img convert wrote, through ib_srp" "$(sha_range "$dev" 0 64)" \
    "$(sha256sum < /tmp/p64 | cut -c1-64)"
lab-ref-detach >/dev/null 2>&1
