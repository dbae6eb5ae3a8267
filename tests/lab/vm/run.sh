#!/bin/bash
# A VM on srp-ublk disks, for real (issues 23 and 45): a QEMU guest (TCG, the lab's kernel) with two
# disks. Its virtio-blk disk is `srp-ublk serve --backend mem`'s NBD export, attached with the exact
# -blockdev options docs/vm-hosts.md gives; its vhost-user-blk disk is the vhost-user-blk front end
# over the fake SRP target with a file for its disk (examples/vhost_fake.rs: no RDMA on the host),
# attached with docs/vm-hosts.md's shared memory and socket and QEMU's own defaults for the device
# (its queues, one per vCPU, and queue size). The guest makes an ext4 file system on each, writes
# files and powers off; the host reads each disk back (the export through nbdcopy, the file as it
# is) and checks the files and the file system. Then the libvirt <disk> elements of
# docs/vm-hosts.md, each in a minimal domain, must validate with virt-xml-validate (the NBD disk,
# and the vhost-user-blk disk with its memory backing). Prints "vm: N passed, N failed".
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
BIN=${SRP_UBLK_BIN:-$ROOT/target/release/srp-ublk}
FAKE=${VHOST_FAKE_BIN:-$ROOT/target/debug/examples/vhost_fake}
DOC=$ROOT/docs/vm-hosts.md
WORK=$ROOT/target/lab/vm
fail() { echo "vm: FAIL: $*"; echo "vm: 0 passed, 1 failed"; exit 1; }
# the VM's memory, all of it shared with the vhost-user-blk server; its vCPUs
MEM=1024M
LAB_SMP=${LAB_SMP:-2}
export LAB_SMP
for p in libvirt-clients libxml2-utils libnbd-bin e2fsprogs; do
    dpkg -s "$p" >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "$p" >/dev/null; }
done
[ -x "$FAKE" ] || fail "no $FAKE: cargo build --example vhost_fake --features test-utils (just vm-test does)"
rm -rf "$WORK"; mkdir -p "$WORK"
# the documented options, as written: the first -blockdev/-device pair of the NBD section
blockdev=$(grep -m1 -o -- '-blockdev driver=nbd,server.type=unix[^ ]*' "$DOC") || fail "no -blockdev line in $DOC"
device=$(grep -m1 -o -- '-device virtio-blk-pci,drive=[^ ]*' "$DOC") || fail "no -device line in $DOC"
sock=$(echo "$blockdev" | sed 's/.*server.path=\([^,]*\).*/\1/')
export_name=$(echo "$blockdev" | sed 's/.*export=\([^,]*\).*/\1/')
echo "vm: qemu options from docs/vm-hosts.md: $blockdev $device"
# the vhost-user-blk disk: the documented memory backing (the VM's -m) and socket, and the device
# with nothing but its chardev (QEMU's defaults for the rest)
memory=$(grep -m1 -o -- '-object memory-backend-memfd,id=mem,size=[^ ]*' "$DOC") || fail "no memory-backend-memfd in $DOC"
numa=$(grep -m1 -o -- '-numa node,memdev=mem' "$DOC") || fail "no -numa node,memdev=mem in $DOC"
chardev=$(grep -m1 -o -- '-chardev socket,id=vhost0,path=[^ ]*' "$DOC") || fail "no vhost-user -chardev in $DOC"
vdevice=$(grep -m1 -o -- '-device vhost-user-blk-pci,chardev=vhost0' "$DOC") || fail "no vhost-user-blk-pci -device in $DOC"
vsock=$WORK/vhost.sock
vhost="$(echo "$memory" | sed "s/size=[^,]*/size=$MEM/") $numa $(echo "$chardev" | sed "s|path=[^,]*|path=$vsock|") $vdevice"
echo "vm: qemu options for vhost-user-blk: $vhost"
"$BIN" serve --backend mem:256M --name "$export_name" --nbd "unix:$sock" > "$WORK/serve.log" 2>&1 &
srv=$!
truncate -s 256M "$WORK/vhost.raw"
"$FAKE" "$vsock" "$WORK/vhost.raw" 4 > "$WORK/vhost.log" 2>&1 &
vsrv=$!
trap 'kill $srv $vsrv 2>/dev/null; wait $srv $vsrv 2>/dev/null || true' EXIT
i=0; while { [ ! -S "$sock" ] || [ ! -S "$vsock" ]; } && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -S "$sock" ] || fail "serve did not create $sock: $(cat "$WORK/serve.log")"
[ -S "$vsock" ] || fail "vhost_fake did not create $vsock: $(cat "$WORK/vhost.log")"
rm -f "$ROOT"/target/lab/out/vm-sums-*.txt "$ROOT/target/lab/out/vm-vhost.txt"
t0=$SECONDS
LAB_SETUP=minimal LAB_MEM=$MEM LAB_QEMU_EXTRA="$blockdev $device $vhost" LAB_TIMEOUT=900 \
    bash "$ROOT/tests/lab/lab.sh" run "$ROOT/tests/lab/vm/guest-fs.sh" || fail "the guest failed"
echo "vm: guest booted, wrote and powered off in $((SECONDS - t0)) s"
# check NAME RAW: the file system on RAW (the guest's NAME disk) clean, and the files the guest
# wrote on it as it wrote them
check() {
    cp "$ROOT/target/lab/out/vm-sums-$1.txt" "$WORK/" || fail "the guest recorded no checksums for its $1 disk"
    e2fsck -fn "$2" > "$WORK/fsck-$1.log" 2>&1 || { cat "$WORK/fsck-$1.log"; fail "e2fsck of the $1 disk read back"; }
    rm -rf "$WORK/files"; mkdir -p "$WORK/files/dir"
    for f in data.bin hello.txt dir/f1 dir/f50; do
        debugfs -R "dump /$f $WORK/files/$f" "$2" 2>/dev/null
    done
    (cd "$WORK/files" && sha256sum -c "$WORK/vm-sums-$1.txt") || fail "files read back from the $1 disk differ from what the guest wrote"
    echo "vm: $1 disk: ext4 clean, 4 files match the guest's checksums (16 MiB data.bin among them)"
}
# the host reads the NBD disk back through the export
nbdcopy "nbd+unix:///$export_name?socket=$sock" "$WORK/disk.raw" || fail "nbdcopy from the export"
check nbd "$WORK/disk.raw"
# the vhost-user-blk disk: QEMU gave it a queue per vCPU, and the guest's buffers went to the
# target as they were (the server's summary when QEMU left)
grep -q "^vm: vhost-user-blk disk .*: $LAB_SMP queue(s)" "$ROOT/target/lab/out/vm-vhost.txt" ||
    fail "QEMU's default is a queue per vCPU ($LAB_SMP): $(cat "$ROOT/target/lab/out/vm-vhost.txt")"
i=0; while ! grep -q "queue 0: [0-9]* requests" "$WORK/vhost.log" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
zc=$(grep -o 'queue [0-9]*: [0-9]* requests, [0-9]* MiB zero copy' "$WORK/vhost.log" | awk '{ s += $5 } END { print s + 0 }')
[ "$zc" -ge 8 ] || { cat "$WORK/vhost.log"; fail "the vhost-user-blk server lent less than 8 MiB of the guest's memory as it was ($zc MiB)"; }
kill $vsrv; wait $vsrv 2>/dev/null || true
check vhost "$WORK/vhost.raw"
echo "vm: vhost-user-blk with QEMU's defaults: $LAB_SMP queues (one per vCPU), $zc MiB of the guest's memory lent as it was"
# the libvirt snippet, in a minimal domain
{
    echo "<domain type='kvm'><name>vm0</name><memory unit='MiB'>512</memory>"
    echo "<os><type arch='x86_64'>hvm</type></os><devices>"
    sed -n "/^<disk type='network'/,/^<\/disk>/p" "$DOC"
    echo "</devices></domain>"
} > "$WORK/domain.xml"
grep -q "protocol='nbd'" "$WORK/domain.xml" || fail "no libvirt <disk> element in $DOC"
virt-xml-validate "$WORK/domain.xml" domain || fail "the libvirt XML of docs/vm-hosts.md does not validate"
# and the vhost-user-blk one: the shared memory backing and the <disk type='vhostuser'>
{
    echo "<domain type='kvm'><name>vm1</name><memory unit='MiB'>512</memory>"
    grep "^<memoryBacking>" "$DOC"
    echo "<os><type arch='x86_64'>hvm</type></os><devices>"
    sed -n "/^<disk type='vhostuser'/,/^<\/disk>/p" "$DOC"
    echo "</devices></domain>"
} > "$WORK/domain-vhost.xml"
grep -q "type='vhostuser'" "$WORK/domain-vhost.xml" && grep -q "<memoryBacking>" "$WORK/domain-vhost.xml" ||
    fail "no libvirt vhost-user-blk <disk> and <memoryBacking> in $DOC"
virt-xml-validate "$WORK/domain-vhost.xml" domain ||
    fail "the libvirt vhost-user-blk XML of docs/vm-hosts.md does not validate"
echo "vm: 1 passed, 0 failed"
