#!/bin/bash
# VMs on the SRP LUNs, in the lab (issues 23 and 45): inside the lab guest (TCG), a second QEMU (TCG
# under TCG) boots the lab's kernel with two data disks, each with the QEMU options docs/vm-hosts.md
# gives for it: LUN 5 (a dm device LIO exports) through `srp-ublk serve --vhost-user-blk` (the
# guest's memory shared with the server, the target reading and writing it directly) and LUN 1 as
# virtio-blk on /dev/ublkbN (cache.direct=on). The VM makes ext4 on each, writes files and runs fio
# with verify on the vhost-user-blk disk, during which the lab guest hot-plugs memory into it,
# flaps the link, drops the target port, kills the server with writes held at the target and
# starts a new one (QEMU reconnects), upgrades it in place and grows the LUN (the VM's disk grows
# with it); then it powers off and the lab guest checks both file systems and the files: LUN 5's through the
# kernel's ib_srp, LUN 1's on /dev/ublkbN (tests/lab/vm/guest-nested.sh). The inner QEMU, its
# firmware, the kernel, a small initramfs and fio come from the host through a 9p share.
# NESTED_MODE=bench runs `just bench vm`'s rounds instead (tests/lab/bench/vm-guest.sh).
# VM_KILLS=N kills and restarts the server N times in a row under the VM's fio (default 1).
# Prints "vm-lab: N passed, N failed" and how long the inner VM took.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
LAB=${LAB_DIR:-$ROOT/target/lab}
NEST=$LAB/nested
fail() { echo "vm-lab: FAIL: $*"; echo "vm-lab: 0 passed, 1 failed"; exit 1; }
bash "$ROOT/tests/lab/lab.sh" prep
KDIR=$(ls -d "$LAB"/kernels/linux-image-6.12* | sort -V | tail -1)
KV=$(ls "$KDIR/lib/modules")
rm -rf "$NEST"; mkdir -p "$NEST"/{lib,firmware,init/{bin,sbin,lib64,mods,proc,sys,dev,mnt,tmp}}
# the inner QEMU and its libraries, run through the dynamic loader with --library-path
Q=/usr/bin/qemu-system-x86_64
cp "$Q" "$NEST/"
for lib in $(ldd "$Q" | grep -o '/[^ )]*'); do cp -L "$lib" "$NEST/lib/"; done
for f in /usr/share/seabios/bios-256k.bin /usr/share/qemu/linuxboot_dma.bin /usr/share/qemu/linuxboot.bin \
         /usr/share/qemu/kvmvapic.bin; do
    cp -L "$f" "$NEST/firmware/" || fail "no $f (seabios, qemu-system-data)"
done
cp "$KDIR/boot/vmlinuz-$KV" "$NEST/vmlinuz"
# the inner initramfs: busybox, mke2fs, the block and file system modules, the job as /init
I=$NEST/init
cp /bin/busybox "$I/bin/busybox"
for a in sh mount umount insmod sleep cat echo dd mkdir sha256sum sync poweroff seq cut; do
    ln -s busybox "$I/bin/$a"
done
cp -L /usr/sbin/mke2fs "$I/sbin/mke2fs"
for lib in $(ldd /usr/sbin/mke2fs | grep -o '/[^ )]*'); do
    mkdir -p "$I$(dirname "$lib")"; cp -L "$lib" "$I$lib"
done
for m in crc16 mbcache jbd2 crc32c_generic ext4 virtio_blk; do
    f=$(modinfo -b "$KDIR" -k "$KV" -F filename "$m" 2>/dev/null) || continue
    case $f in
        *.xz) xz -dc "$f" > "$I/mods/$m.ko";;
        *.zst) zstd -qdc "$f" > "$I/mods/$m.ko";;
        /*) cp "$f" "$I/mods/$m.ko";;
    esac
done
install -m 755 "$ROOT/tests/lab/vm/inner-init.sh" "$I/init"
(cd "$I" && find . | cpio -o -H newc --quiet | gzip -1) > "$NEST/initrd.gz"
rm -rf "$I"
# fio for the inner VM, with its libraries, on a read-only ext2 image (its disk with serial "tools")
MODE=${NESTED_MODE:-both}
case $MODE in both|bench) ;; *) fail "NESTED_MODE=$MODE: want both (the default) or bench";; esac
T=$NEST/tools-root
mkdir -p "$T/lib"
cp -L /usr/bin/fio "$T/fio" || fail "no /usr/bin/fio on this host (apt-get install fio)"
for lib in $(ldd /usr/bin/fio | grep -o '/[^ )]*'); do cp -L "$lib" "$T/lib/"; done
cp -L /lib64/ld-linux-x86-64.so.2 "$T/lib/"
mke2fs -q -t ext2 -d "$T" -L tools "$NEST/tools.img" $(( $(du -sm "$T" | cut -f1) + 16 ))M ||
    fail "making the tools image"
rm -rf "$T"
DOC=$ROOT/docs/vm-hosts.md
# the documented options for a vhost-user-blk disk, as written
mem=$(grep -m1 -o -- '-object memory-backend-memfd,[^ ]*' "$DOC") || fail "no memory-backend-memfd in $DOC"
numa=$(grep -m1 -o -- '-numa node,memdev=[^ ]*' "$DOC") || fail "no -numa line in $DOC"
chardev=$(grep -m1 -o -- '-chardev socket,id=vhost0,[^ ]*' "$DOC") || fail "no vhost-user -chardev in $DOC"
device=$(grep -m1 -o -- '-device vhost-user-blk-pci,[^ ]*' "$DOC") || fail "no vhost-user-blk-pci in $DOC"
echo "$mem $numa $chardev $device" > "$NEST/qemu-disk-opts"
# and for a VM on /dev/ublkbN (the first -blockdev/-device pair), its node named ublk0
blockdev=$(grep -m1 -o -- '-blockdev driver=host_device,[^ ]*' "$DOC") || fail "no host_device -blockdev in $DOC"
blkdevice=$(grep -m1 -o -- '-device virtio-blk-pci,drive=[^ ]*' "$DOC") || fail "no -device line in $DOC"
node=$(echo "$blockdev" | grep -o 'node-name=[^,]*' | cut -d= -f2)
echo "$blockdev" | sed 's/node-name=[^,]*/node-name=ublk0/' > "$NEST/qemu-ublk-opts"
[ "$blkdevice" = "-device virtio-blk-pci,drive=$node" ] || fail "$DOC's -device line ($blkdevice) is not for its -blockdev ($node)"
if [ "$MODE" = bench ]; then
    # beside them, the same LUN on ib_srp's disk (docs' options)
    echo "$blockdev" | sed 's/node-name=[^,]*/node-name=ref0/' > "$NEST/qemu-ref-opts"
fi
echo "$MODE" > "$NEST/mode"
echo "vm-lab: qemu options from docs/vm-hosts.md: $(cat "$NEST/qemu-disk-opts") and $(cat "$NEST/qemu-ublk-opts")"
echo "vm-lab: inner VM staged in $NEST ($(du -sh "$NEST" | cut -f1))"
script=$ROOT/tests/lab/vm/guest-nested.sh
echo "VM_KILLS=${VM_KILLS:-1}" > "$NEST/nested.env"
if [ "$MODE" = bench ]; then
    script=$ROOT/tests/lab/bench/vm-guest.sh
    echo "ROUNDS=${BENCH_ROUNDS:-3} SECS=${BENCH_SECS:-10}" > "$NEST/bench.env"
    rm -f "$LAB/out/vm-bench.txt"
fi
t0=$SECONDS
LAB_TIMEOUT=${LAB_TIMEOUT:-1500} \
    LAB_QEMU_EXTRA="-virtfs local,path=$NEST,mount_tag=nested,security_model=none,id=nested" \
    bash "$ROOT/tests/lab/lab.sh" run "$script" || fail "the lab guest failed"
if [ "$MODE" = bench ]; then
    stamp=$(date -u +%Y%m%dT%H%M%SZ)
    mkdir -p "$ROOT/target/bench"
    cp "$LAB/out/vm-bench.txt" "$ROOT/target/bench/vm-$stamp.txt" || fail "the lab guest wrote no vm-bench.txt"
    python3 "$ROOT/tests/lab/bench/vm.py" "$ROOT/target/bench/vm-$stamp.txt" "$ROOT/target/bench/vm-$stamp.json"
    exit 0
fi
echo "vm-lab: the lab guest finished in $((SECONDS - t0)) s"
cat "$LAB/out/nested-time.txt" 2>/dev/null || true
echo "vm-lab: 1 passed, 0 failed"
