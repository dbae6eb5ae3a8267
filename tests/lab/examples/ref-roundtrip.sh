#!/bin/sh
# just lab-run tests/lab/examples/ref-roundtrip.sh: write a pattern through the reference initiator's
# device and read it back. Exits 0 when the bytes compare equal.
set -e
dev=$(lab-ref-attach)
dd if=/dev/urandom of=/tmp/pat bs=1M count=4 2>/dev/null
dd if=/tmp/pat of="$dev" bs=1M oflag=direct conv=fsync 2>/dev/null
dd if="$dev" of=/tmp/rb bs=1M count=4 iflag=direct 2>/dev/null
cmp /tmp/pat /tmp/rb && echo "round trip through $dev: equal"
sha256sum /tmp/pat > "$LAB_OUT/pattern.sha256"
lab-ref-detach
