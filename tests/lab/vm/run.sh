#!/bin/bash
# A VM on an srp-ublk disk, for real (issue 23): `srp-ublk serve --backend mem` on the host, and a
# QEMU guest (TCG, the lab's kernel) whose virtio-blk disk is that NBD export, attached with the exact
# -blockdev options docs/vm-hosts.md gives. The guest makes an ext4 file system, writes files and
# powers off; the host reads the disk back through the export and checks the files and the file
# system. Then the libvirt <disk> elements of docs/vm-hosts.md, each in a minimal domain, must
# validate with virt-xml-validate (the NBD disk, and the vhost-user-blk disk with its memory
# backing). Prints "vm: N passed, N failed".
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
BIN=${SRP_UBLK_BIN:-$ROOT/target/release/srp-ublk}
DOC=$ROOT/docs/vm-hosts.md
WORK=$ROOT/target/lab/vm
fail() { echo "vm: FAIL: $*"; echo "vm: 0 passed, 1 failed"; exit 1; }
for p in libvirt-clients libxml2-utils libnbd-bin e2fsprogs; do
    dpkg -s "$p" >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "$p" >/dev/null; }
done
rm -rf "$WORK"; mkdir -p "$WORK"
# the documented options, as written: the first -blockdev/-device pair of the NBD section
blockdev=$(grep -m1 -o -- '-blockdev driver=nbd,server.type=unix[^ ]*' "$DOC") || fail "no -blockdev line in $DOC"
device=$(grep -m1 -o -- '-device virtio-blk-pci,drive=[^ ]*' "$DOC") || fail "no -device line in $DOC"
sock=$(echo "$blockdev" | sed 's/.*server.path=\([^,]*\).*/\1/')
export_name=$(echo "$blockdev" | sed 's/.*export=\([^,]*\).*/\1/')
echo "vm: qemu options from docs/vm-hosts.md: $blockdev $device"
"$BIN" serve --backend mem:256M --name "$export_name" --nbd "unix:$sock" > "$WORK/serve.log" 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null; wait $srv 2>/dev/null || true' EXIT
i=0; while [ ! -S "$sock" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -S "$sock" ] || fail "serve did not create $sock: $(cat "$WORK/serve.log")"
t0=$SECONDS
LAB_SETUP=minimal LAB_QEMU_EXTRA="$blockdev $device" LAB_TIMEOUT=900 \
    bash "$ROOT/tests/lab/lab.sh" run "$ROOT/tests/lab/vm/guest-fs.sh" || fail "the guest failed"
echo "vm: guest booted, wrote and powered off in $((SECONDS - t0)) s"
cp "$ROOT/target/lab/out/vm-sums.txt" "$WORK/" || fail "the guest recorded no checksums"
# the host reads the disk back through the export
nbdcopy "nbd+unix:///$export_name?socket=$sock" "$WORK/disk.raw" || fail "nbdcopy from the export"
e2fsck -fn "$WORK/disk.raw" > "$WORK/fsck.log" 2>&1 || { cat "$WORK/fsck.log"; fail "e2fsck of the disk read back"; }
mkdir -p "$WORK/files/dir"
for f in data.bin hello.txt dir/f1 dir/f50; do
    debugfs -R "dump /$f $WORK/files/$f" "$WORK/disk.raw" 2>/dev/null
done
(cd "$WORK/files" && sha256sum -c "$WORK/vm-sums.txt") || fail "files read back differ from what the guest wrote"
echo "vm: ext4 clean, 4 files match the guest's checksums (16 MiB data.bin among them)"
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
