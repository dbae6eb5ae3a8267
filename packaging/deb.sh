#!/bin/bash
# just deb: target/deb/srp-ublk_VERSION_ARCH.deb from packaging/install.sh's file list, its
# Depends computed from the binary's shared libraries (dpkg-shlibdeps), maintainer scripts that
# reload systemd and udev but start nothing, then lintian (errors fail the build; the warnings
# left are explained in packaging/lintian-overrides). SRP_UBLK_BIN: the binary (default
# target/release/srp-ublk); DEB_OUT: where (default target/deb); DEB_LINT=0: no lintian (the lab
# packages the binary it tests this way).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${SRP_UBLK_BIN:-$ROOT/target/release/srp-ublk}
OUT=${DEB_OUT:-$ROOT/target/deb}
LINT=${DEB_LINT:-1}
pkgs="dpkg-dev"; [ "$LINT" = 0 ] || pkgs="$pkgs lintian"
for p in $pkgs; do
    dpkg -s "$p" >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "$p" >/dev/null; }
done
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)-1
ARCH=$(dpkg --print-architecture)
S=$OUT/root
rm -rf "$OUT"; mkdir -p "$S/DEBIAN"
SRP_UBLK_STRIP=1 bash "$ROOT/packaging/install.sh" "$BIN" "$S"
DOC=$S/usr/share/doc/srp-ublk
# Debian's documentation rules: a copyright file and a changelog (the .md pages stay as they are:
# the units' Documentation= names operations.md)
install -m 644 "$ROOT/packaging/copyright" "$DOC/copyright"
commit=$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
date=$(git -C "$ROOT" log -1 --format=%aD 2>/dev/null || date -R)
printf 'srp-ublk (%s) unstable; urgency=medium\n\n  * Built from commit %s.\n\n -- srp-ublk developers <srp-ublk@example.org>  %s\n' \
    "$VERSION" "$commit" "$date" | gzip -9n > "$DOC/changelog.Debian.gz"
install -D -m 644 "$ROOT/packaging/lintian-overrides" "$S/usr/share/lintian/overrides/srp-ublk"
# Depends from the binary's libraries (dpkg-shlibdeps wants a debian/control to read)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debian"
printf 'Source: srp-ublk\n\nPackage: srp-ublk\nArchitecture: any\n' > "$work/debian/control"
depends=$(cd "$work" && dpkg-shlibdeps -O -e"$S/usr/sbin/srp-ublk" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "deb: dpkg-shlibdeps found no dependencies for $BIN" >&2; exit 1; }
size=$(du -sk --exclude=DEBIAN "$S" | cut -f1)
cat > "$S/DEBIAN/control" <<CONTROL
Package: srp-ublk
Version: $VERSION
Architecture: $ARCH
Maintainer: srp-ublk developers <srp-ublk@example.org>
Installed-Size: $size
Depends: $depends
Recommends: ibverbs-providers, rdma-core
Suggests: multipath-tools, srptools
Section: admin
Priority: optional
Homepage: https://github.com/srp-ublk/srp-ublk
Description: userspace SRP initiator presenting remote LUNs as ublk block devices
 srp-ublk logs in to SCSI RDMA Protocol (SRP) targets over InfiniBand, RoCE
 or iWARP and presents each LUN as a block device, /dev/ublkbN, through the
 kernel's ublk driver; for virtual machine hosts it also serves a LUN as an
 NBD export or a vhost-user-blk disk. It takes the kernel ib_srp's target
 strings and srp_daemon's rules, keeps ib_srp's reconnect timers, and attaches
 the targets configured in /etc/srp-ublk/targets.d through its systemd units.
CONTROL
for f in postinst prerm postrm; do   # the maintainer scripts, from the one file RPM's scriptlets use too
    printf '#!/bin/sh\nSCRIPT=deb-%s\n' "$f" | cat - "$ROOT/packaging/maint.sh" > "$S/DEBIAN/$f"
    chmod 755 "$S/DEBIAN/$f"
done
(cd "$S" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
    xargs -0 md5sum > DEBIAN/md5sums)
deb=$OUT/srp-ublk_${VERSION}_$ARCH.deb
dpkg-deb --root-owner-group -Zxz --build "$S" "$deb" >/dev/null
echo "deb: $deb ($(du -h "$deb" | cut -f1)), Depends: $depends"
[ "$LINT" = 0 ] && exit 0
# lintian: no error; each warning fixed or overridden with its reason
lintian --fail-on error "$deb" | tee "$OUT/lintian.txt" || {
    echo "deb: lintian found errors (above)" >&2; exit 1; }
echo "deb: lintian: $(grep -c '^E:' "$OUT/lintian.txt" || true) errors, $(grep -c '^W:' "$OUT/lintian.txt" || true) warnings"
