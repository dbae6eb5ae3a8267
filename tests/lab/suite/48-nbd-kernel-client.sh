# The kernel's own NBD client (Debian's nbd-client and the nbd driver) on the SRP LUN, as a block
# device user meets it: it ignores the advertised largest request (here raised to 32 MiB with
# max_sectors_kb) and sends WRITE_ZEROES to a LUN whose backstore (LIO's ramdisk) has no WRITE SAME.
# On each of LIO's three write-cache settings: fio verify on the raw device at 4 KiB-8 MiB,
# `blkdiscard -z`, mkfs.ext4, files of many sizes, fio verify on a file with direct I/O up to 8 MiB
# and buffered 4 MiB writes, fstrim (refused: the LUN has no UNMAP, and the export says so), then
# every file read back through ib_srp. The kernel must log no NBD error and no lost write.
. /usr/lib/srp-lab/suite/lib.sh
rd=/sys/kernel/config/target/core/rd_mcp_0/ramdisk0
wc0=$(cat $rd/attrib/emulate_write_cache); fua0=$(cat $rd/attrib/emulate_fua_write)
restore() { echo "$wc0" > $rd/attrib/emulate_write_cache; echo "$fua0" > $rd/attrib/emulate_fua_write; }
cleanup() {
    umount /mnt 2>/dev/null; nbd-client -d /dev/nbd0 >/dev/null 2>&1
    kill $SRV 2>/dev/null; restore; ublk_cleanup
}
SRV=
trap cleanup EXIT
modprobe nbd nbds_max=2 || fail "modprobe nbd"
SOCK=/run/srp-ublk/k.sock
# files of many sizes (bytes), written through the file system and read back through ib_srp
SIZES="1 511 4096 65537 1048583 5242880 34603008"
for n in $SIZES; do head -c "$n" /dev/urandom > /tmp/f$n; done
# kernel_errors: what the kernel logged about nbd0 since the last `dmesg -c`
kernel_errors() { dmesg -c | grep -i 'nbd0.*error\|lost async page write\|I/O error, dev nbd0' ; }

# case WCE FUA_WRITE
case_() {
    echo "$1" > $rd/attrib/emulate_write_cache || fail "setting emulate_write_cache=$1"
    echo "$2" > $rd/attrib/emulate_fua_write || fail "setting emulate_fua_write=$2"
    dmesg -c >/dev/null
    nbd_serve $SOCK k --queues 2
    out=$(nbd-client -N k -b 4096 -u $SOCK /dev/nbd0 2>&1) || fail "nbd-client (wce $1, fua $2): $out"
    echo 32768 > /sys/block/nbd0/queue/max_sectors_kb || fail "max_sectors_kb 32768"
    expect_eq "nbd0's largest request (KiB)" "$(cat /sys/block/nbd0/queue/max_sectors_kb)" 32768
    # the raw device: fio verify from 4 KiB to 8 MiB, then 16 MiB zeroed by WRITE_ZEROES
    fio --name=raw --filename=/dev/nbd0 --ioengine=io_uring --direct=1 --rw=randwrite \
        --bsrange=4k-8m --iodepth=8 --size=48M --verify=crc32c --verify_fatal=1 \
        --output=/tmp/fio-raw.txt || { cat /tmp/fio-raw.txt; fail "fio on nbd0 (wce $1, fua $2)"; }
    fio_verified /tmp/fio-raw.txt
    ok "fio verify on nbd0, 4 KiB-8 MiB (wce $1, fua $2)"
    /usr/sbin/blkdiscard -z -o $((64 << 20)) -l $((16 << 20)) /dev/nbd0 || fail "blkdiscard -z (wce $1, fua $2)"
    zeros=$(head -c $((16 << 20)) /dev/zero | sha256sum | cut -c1-64)
    expect_eq "16 MiB after blkdiscard -z" "$(sha_range /dev/nbd0 64 16)" "$zeros"
    # a file system, files, fio on files
    mkfs.ext4 -F -q -b 4096 /dev/nbd0 || fail "mkfs.ext4 on nbd0 (wce $1, fua $2)"
    mount -t ext4 /dev/nbd0 /mnt || fail "mount nbd0"
    for n in $SIZES; do cp /tmp/f$n /mnt/f$n || fail "cp f$n"; done
    fio --name=file --filename=/mnt/direct.dat --ioengine=io_uring --direct=1 --rw=randwrite \
        --bsrange=4k-8m --iodepth=4 --size=32M --verify=crc32c --verify_fatal=1 \
        --output=/tmp/fio-file.txt || { cat /tmp/fio-file.txt; fail "fio direct on a file"; }
    fio_verified /tmp/fio-file.txt
    fio --name=buffered --filename=/mnt/buffered.dat --ioengine=psync --direct=0 --rw=write \
        --bs=4m --size=32M --end_fsync=1 --verify=crc32c --verify_fatal=1 \
        --output=/tmp/fio-buf.txt || { cat /tmp/fio-buf.txt; fail "fio buffered on a file"; }
    fio_verified /tmp/fio-buf.txt
    ok "fio verify on files: direct 4 KiB-8 MiB, buffered 4 MiB (wce $1, fua $2)"
    out=$(/usr/sbin/fstrim -v /mnt 2>&1) && fail "fstrim succeeded on an export without TRIM: $out"
    expect_contains "fstrim" "$out" "not supported"
    sync
    umount /mnt || fail "umount"
    nbd-client -d /dev/nbd0 >/dev/null 2>&1 || fail "nbd-client -d"
    kill $SRV; wait $SRV 2>/dev/null
    # the LUN reports it has no WRITE SAME (REPORT SUPPORTED OPERATION CODES): none was sent
    grep -q "the LUN refuses WRITE SAME" /tmp/serve.err && fail "WRITE SAME sent (wce $1, fua $2)"
    errs=$(kernel_errors)
    [ -z "$errs" ] || fail "the kernel logged NBD errors (wce $1, fua $2): $errs"
    ok "no NBD error in the kernel log (wce $1, fua $2)"
    # every file through the reference initiator
    dev=$(lab-ref-attach) || fail "lab-ref-attach"
    mount -t ext4 -o ro,noload "$dev" /mnt || fail "mount $dev through ib_srp"
    for n in $SIZES; do
        expect_eq "f$n through ib_srp (wce $1, fua $2)" "$(sha256sum < /mnt/f$n | cut -c1-64)" \
            "$(sha256sum < /tmp/f$n | cut -c1-64)"
    done
    umount /mnt; lab-ref-detach >/dev/null 2>&1
}
case_ 0 1      # LIO's default: no write cache
case_ 1 0      # a cache without DPOFUA: a FUA write is the write, then SYNCHRONIZE CACHE
case_ 1 1      # a cache with DPOFUA: the FUA bit
trap - EXIT
cleanup
