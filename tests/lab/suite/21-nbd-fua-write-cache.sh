# NBD FUA and FLUSH follow the LUN's write cache, as the ublk front end does (one rule): qemu-io's
# FUA writes (its default writethrough cache sends every write with FUA) succeed on a LUN without a
# write cache (LIO's default, which refuses the FUA bit: before, every such write failed with
# "Operation not supported"), with a cache and no DPOFUA (write then SYNCHRONIZE CACHE), and with both
# (the FUA bit). nbdinfo shows FLUSH/FUA only with a cache; the data reads back through ib_srp.
. /usr/lib/srp-lab/suite/lib.sh
rd=/sys/kernel/config/target/core/rd_mcp_0/ramdisk2
wc0=$(cat $rd/attrib/emulate_write_cache); fua0=$(cat $rd/attrib/emulate_fua_write)
restore() { echo "$wc0" > $rd/attrib/emulate_write_cache; echo "$fua0" > $rd/attrib/emulate_fua_write; }
trap 'kill $SRV 2>/dev/null; restore; ublk_cleanup' EXIT
SOCK=/run/srp-ublk/fua.sock
URI="nbd+unix:///fua?socket=$SOCK"
OPTS="driver=nbd,server.type=unix,server.path=$SOCK,export=fua"
serve() { nbd_serve $SOCK fua --lun 2 --queues 1; }
# case WCE FUA_WRITE WANT_FLAGS BYTE
case_() {
    echo "$1" > $rd/attrib/emulate_write_cache || fail "setting emulate_write_cache=$1"
    echo "$2" > $rd/attrib/emulate_fua_write || fail "setting emulate_fua_write=$2"
    serve
    # writethrough (qemu-io's default): FUA on every write
    out=$(qemu-io --image-opts "$OPTS" -c "write -f -P $4 0 64k" -c "write -P $4 64k 64k" \
        -c "flush" -c "read -P $4 0 128k" 2>&1)
    echo "$out"
    case "$out" in *"failed"*|*"not supported"*|*"Pattern verification failed"*) fail "qemu-io over NBD (wce $1, fua $2): $out";; esac
    expect_contains "qemu-io FUA write (wce $1, fua $2)" "$out" "wrote 65536/65536 bytes at offset 0"
    expect_contains "qemu-io read back (wce $1, fua $2)" "$out" "read 131072/131072 bytes at offset 0"
    info=$(nbdinfo "$URI") || fail "nbdinfo"
    expect_contains "nbdinfo (wce $1, fua $2)" "$info" "can_flush: $3"
    expect_contains "nbdinfo (wce $1, fua $2)" "$info" "can_fua: $3"
    kill $SRV; wait $SRV 2>/dev/null
}
case_ 0 1 false 0x11     # LIO's default: no write cache (the FUA bit is refused)
case_ 1 0 true 0x22      # a cache without DPOFUA: the write, then SYNCHRONIZE CACHE
case_ 1 1 true 0x33      # a cache with DPOFUA: the FUA bit
restore
dev=$(REF_LUN=2 lab-ref-attach) || fail "lab-ref-attach (LUN 2)"
want=$(dd if=/dev/zero bs=128k count=1 2>/dev/null | tr '\0' '\063' | sha256sum | cut -c1-64)
got=$(dd if="$dev" bs=128k count=1 iflag=direct 2>/dev/null | sha256sum | cut -c1-64)
expect_eq "LUN 2's first 128 KiB through ib_srp" "$got" "$want"
trap - EXIT
kill $SRV 2>/dev/null
ublk_cleanup
