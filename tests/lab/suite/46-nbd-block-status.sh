# NBD block status (base:allocation) answered from the LUN's GET LBA STATUS. A thin LUN (the hostile
# target with --thin: LBPME and LBPRZ, GET LBA STATUS from its map of written blocks) behind
# srp-ublk and nbdkit's memory plugin get the same writes: nbdinfo --map, qemu-img map and the
# bytes qemu-img convert reads agree between them, and the map has holes (so the test fails if
# srp-ublk reports every block as data). A target whose GET LBA STATUS answer skips the block asked
# for (case lba-status) gets every block reported as data. LIO refuses GET LBA STATUS (INVALID
# FIELD IN CDB): its thin fileio LUN is reported as data, with one log line.
. /usr/lib/srp-lab/suite/lib.sh
. /usr/lib/srp-lab/setup.sh
hostile_setup
HPID=; SRV=; KPID=
FIO=$CFG/core/fileio_46/thin
unmap_fileio() {
    [ -d "$FIO" ] || return 0
    lab_unmap_lun "$SRP_TPG" $LAB_IP 46 thin
    rmdir "$FIO" "$CFG/core/fileio_46" 2>/dev/null
}
trap 'kill $SRV $KPID $HPID 2>/dev/null; unmap_fileio; rm -f /tmp/thin.img' EXIT
SOCK=/run/srp-ublk/thin.sock
KSOCK=/tmp/nbdkit.sock
mkdir -p /run/srp-ublk

# hostile CASE: the thin hostile target with CASE
hostile() {
    hostile-target --listen "$HT_ADDR" --case "$1" --mib 16 --thin 2> /tmp/ht-thin-$1.err &
    HPID=$!
    _i=0; while ! grep -q listening /tmp/ht-thin-$1.err && [ $_i -lt 50 ]; do sleep 0.1; _i=$((_i + 1)); done
}
stop() { kill $SRV $HPID 2>/dev/null; wait $SRV $HPID 2>/dev/null; SRV=; HPID=; }
# the same writes to both: 64 KiB at 0, 192 KiB at 1 MiB, 64 KiB at 5 MiB + 64 KiB, the last MiB
write_all() {
    qemu-io --image-opts "$1" -c "write -P 0x5a 0 64k" -c "write -P 0x5b 1M 192k" \
        -c "write -P 0x5c 5184k 64k" -c "write -P 0x5d 15M 1M" > /tmp/qio.out 2>&1 ||
        fail "qemu-io writes ($1): $(cat /tmp/qio.out)"
}
qmap() { qemu-img map --output=json --image-opts "$1" 2>&1; }

hostile none
NBD_TARGET=$HT_TARGET nbd_serve $SOCK thin --queues 1
OURS="driver=nbd,server.type=unix,server.path=$SOCK,export=thin"
write_all "$OURS"
nbdkit -f -U $KSOCK memory 16M 2> /tmp/nbdkit.err &
KPID=$!
_i=0; while [ ! -S $KSOCK ] && [ $_i -lt 100 ]; do sleep 0.1; _i=$((_i + 1)); done
[ -S $KSOCK ] || fail "nbdkit did not start: $(cat /tmp/nbdkit.err)"
THEIRS="driver=nbd,server.type=unix,server.path=$KSOCK"
write_all "$THEIRS"
m_ours=$(nbdinfo --map "nbd+unix:///thin?socket=$SOCK") || fail "nbdinfo --map (srp-ublk)"
m_theirs=$(nbdinfo --map "nbd+unix:///?socket=$KSOCK") || fail "nbdinfo --map (nbdkit)"
echo "srp-ublk:"; echo "$m_ours"; echo "nbdkit:"; echo "$m_theirs"
expect_eq "nbdinfo --map of the thin LUN, as nbdkit's" "$m_ours" "$m_theirs"
expect_contains "the thin LUN's map" "$m_ours" "hole,zero"
q_ours=$(qmap "$OURS"); q_theirs=$(qmap "$THEIRS")
expect_eq "qemu-img map of the thin LUN, as nbdkit's" "$q_ours" "$q_theirs"
qemu-img convert -f raw -O raw "nbd+unix:///thin?socket=$SOCK" /tmp/ours.raw || fail "qemu-img convert (srp-ublk)"
qemu-img convert -f raw -O raw "nbd+unix:///?socket=$KSOCK" /tmp/theirs.raw || fail "qemu-img convert (nbdkit)"
expect_eq "bytes qemu-img convert read" "$(sha256sum < /tmp/ours.raw | cut -c1-64)" \
    "$(sha256sum < /tmp/theirs.raw | cut -c1-64)"
rm -f /tmp/ours.raw /tmp/theirs.raw
kill $KPID; wait $KPID 2>/dev/null; KPID=
stop

# a target whose answer does not describe the block asked for: every block is data
hostile lba-status
NBD_TARGET=$HT_TARGET nbd_serve $SOCK thin --queues 1
m=$(nbdinfo --map "nbd+unix:///thin?socket=$SOCK") || fail "nbdinfo --map (lba-status)"
echo "$m"
expect_contains "lies in GET LBA STATUS" "$(cat /tmp/ht-thin-lba-status.err)" "answered with lies"
expect_eq "map when GET LBA STATUS lies" "$(echo $m)" "0 16777216 0 data"
stop

# LIO: a thin fileio LUN (emulate_tpu=1 sets LBPME); LIO answers GET LBA STATUS with INVALID FIELD
# IN CDB, so every block is data and the daemon says why, once
truncate -s 16M /tmp/thin.img
mkdir -p "$FIO" || fail "fileio backstore"
echo "fd_dev_name=/tmp/thin.img,fd_dev_size=16777216" > "$FIO/control"
echo 1 > "$FIO/enable" || fail "enabling the fileio backstore"
echo 1 > "$FIO/attrib/emulate_tpu" || fail "emulate_tpu=1 on fileio"
lab_map_lun "$SRP_TPG" $LAB_IP 46 "$FIO" || fail "mapping the fileio LUN as LUN 46"
nbd_serve $SOCK lio --lun 46 --queues 1
m1=$(nbdinfo --map "nbd+unix:///lio?socket=$SOCK") || fail "nbdinfo --map (LIO)"
m2=$(nbdinfo --map "nbd+unix:///lio?socket=$SOCK") || fail "nbdinfo --map (LIO, again)"
echo "$m1"
expect_eq "map of LIO's thin LUN" "$(echo $m1)" "0 16777216 0 data"
expect_eq "map of LIO's thin LUN, asked again" "$(echo $m2)" "0 16777216 0 data"
n=$(grep -c "refuses GET LBA STATUS" /tmp/serve.err)
expect_eq "log lines about LIO's refusal" "$n" "1"
stop
