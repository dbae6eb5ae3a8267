#!/bin/bash
# just rpm: target/rpm/srp-ublk-VERSION-1.ARCH.rpm from packaging/install.sh's file list (the
# Debian package's), packaging/srp-ublk.spec and the scriptlets made from packaging/maint.sh;
# its Requires from the binary's shared libraries (rpm's ELF dependency generator); then
# `rpm -qlp` (the file list must be the Debian package's, less Debian's own files) and rpmlint
# (errors fail the build; what is left is explained in packaging/rpmlint.toml).
# SRP_UBLK_BIN: the binary (default target/release/srp-ublk); RPM_OUT: where (default target/rpm);
# RPM_LINT=0: no rpmlint (the lab packages the binary it tests this way).
# Built here on Debian (rpm and rpmlint from its packages) or on a RHEL-family host (dnf install
# rpm-build rpmlint); build on the oldest release the package is for: the binary needs that
# release's glibc or older (`rpm -qp --requires` lists the GLIBC_ versions).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${SRP_UBLK_BIN:-$ROOT/target/release/srp-ublk}
OUT=${RPM_OUT:-$ROOT/target/rpm}
LINT=${RPM_LINT:-1}
pkgs=rpm; [ "$LINT" = 0 ] || pkgs="$pkgs rpmlint"
if ! command -v rpmbuild >/dev/null || { [ "$LINT" != 0 ] && ! command -v rpmlint >/dev/null; }; then
    command -v apt-get >/dev/null || { echo "rpm: rpmbuild or rpmlint is missing (dnf install rpm-build rpmlint)" >&2; exit 1; }
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
fi
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)
rm -rf "$OUT"; mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
S=$work/stage
SRP_UBLK_STRIP=1 bash "$ROOT/packaging/install.sh" "$BIN" "$S"
files() { (cd "$1" && find . -type f -printf '/%P\n' | LC_ALL=C sort); }
# install.sh's list (the Debian package's less Debian's own files), with zsh's directory moved
files "$S" | sed 's|/zsh/vendor-completions/|/zsh/site-functions/|' > "$work/install.list"
# the one place the two distributions differ: zsh's completions directory on Fedora and RHEL
mkdir -p "$S/usr/share/zsh/site-functions"
mv "$S/usr/share/zsh/vendor-completions/_srp-ublk" "$S/usr/share/zsh/site-functions/"
rmdir "$S/usr/share/zsh/vendor-completions"
install -D -m 644 "$ROOT/packaging/copyright" "$S/usr/share/licenses/srp-ublk/copyright"
# %files: every file; the directories that are the package's own; docs and the licence marked
{
    echo "%dir /etc/srp-ublk"
    echo "%dir /etc/srp-ublk/targets.d"
    echo "%dir /etc/srp-ublk/exports.d"
    echo "%dir /usr/share/doc/srp-ublk"
    echo "%dir /usr/share/doc/srp-ublk/examples"
    echo "%dir /usr/share/licenses/srp-ublk"
    files "$S" | sed \
        -e 's|^/usr/share/doc/|%doc /usr/share/doc/|' -e 's|^/usr/share/licenses/|%license /usr/share/licenses/|'
} > "$work/files"
mkdir -p "$work/scripts"
for s in post preun postun; do
    printf 'SCRIPT=rpm-%s\n' "$s" | cat - "$ROOT/packaging/maint.sh" > "$work/scripts/$s"
done
commit=$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
when=$(git -C "$ROOT" log -1 --format=%ad --date=format:'%a %b %d %Y' 2>/dev/null || date -u '+%a %b %d %Y')
rpmbuild -bb --quiet "$ROOT/packaging/srp-ublk.spec" \
    --define "_topdir $work/top" --define "_rpmdir $OUT" --define "_build_id_links none" \
    --define "debug_package %{nil}" --define "__strip /bin/true" \
    --define "pkg_version $VERSION" --define "commit $commit" --define "changelog_date $when" \
    --define "stage $S" --define "filelist $work/files" --define "scripts $work/scripts" \
    > "$work/rpmbuild.log" 2>&1 || { cat "$work/rpmbuild.log" >&2; echo "rpm: rpmbuild failed (above)" >&2; exit 1; }
rpm=$(find "$OUT" -name "srp-ublk-$VERSION-1.*.rpm" | head -1)
[ -n "$rpm" ] || { cat "$work/rpmbuild.log" >&2; echo "rpm: rpmbuild made no package" >&2; exit 1; }
mv "$rpm" "$OUT/"; rpm=$OUT/${rpm##*/}
find "$OUT" -mindepth 1 -type d -empty -delete
echo "rpm: $rpm ($(du -h "$rpm" | cut -f1)), Requires: $(rpm -qp --requires "$rpm" 2>/dev/null |
    grep -v '^rpmlib(' | sort -u | tr '\n' ' ')"
# every file of install.sh's list is in the package
rpm -qlp "$rpm" 2>/dev/null | LC_ALL=C sort > "$OUT/files.txt"
missing=$(LC_ALL=C comm -23 "$work/install.list" "$OUT/files.txt")
[ -z "$missing" ] || { echo "rpm: install.sh's files missing from the package: $missing" >&2; exit 1; }
[ "$LINT" = 0 ] && exit 0
# rpmlint: no error; what is left filtered with its reason
rpmlint -c "$ROOT/packaging/rpmlint.toml" "$rpm" | tee "$OUT/rpmlint.txt" || {
    echo "rpm: rpmlint found errors (above)" >&2; exit 1; }
echo "rpm: rpmlint: $(grep -c ': E: ' "$OUT/rpmlint.txt" || true) errors, $(grep -c ': W: ' "$OUT/rpmlint.txt" || true) warnings"
