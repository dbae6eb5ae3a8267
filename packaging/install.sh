#!/bin/bash
# packaging/install.sh BINARY [DESTDIR]: srp-ublk's files where a distribution puts them, under
# DESTDIR (default /): the one file list `just install`, `just deb` and `just rpm` share.
# SRP_UBLK_STRIP=1 (the packages): the installed binary without debug info (the release profile
# keeps it, for profiles).
#   /usr/sbin/srp-ublk                         the binary (the units and udev rules run it from here)
#   /usr/lib/systemd/system/srp-ublk*@.service the units
#   /usr/lib/udev/rules.d/6[01]-srp-ublk*.rules the udev rules
#   /usr/share/man/man8/srp-ublk*.8.gz         srp-ublk(8) and a page per subcommand
#   bash, zsh and fish completions, the docs and examples in /usr/share/doc/srp-ublk,
#   /etc/srp-ublk/targets.d and exports.d (empty: the administrator's target and export files)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${1:?usage: install.sh BINARY [DESTDIR]}
D=${2:-}
[ -x "$BIN" ] || { echo "install.sh: $BIN is not an executable (cargo build --release first)" >&2; exit 2; }
DOC=$D/usr/share/doc/srp-ublk
install -D -m 755 "$BIN" "$D/usr/sbin/srp-ublk"
if [ "${SRP_UBLK_STRIP:-0}" = 1 ]; then
    strip --strip-unneeded --remove-section=.comment --remove-section=.note "$D/usr/sbin/srp-ublk"
fi
install -d "$D/usr/lib/systemd/system" "$D/usr/lib/udev/rules.d" "$DOC/examples" "$D/etc/srp-ublk/targets.d" \
    "$D/etc/srp-ublk/exports.d"
install -m 644 "$ROOT"/systemd/*.service "$D/usr/lib/systemd/system/"
install -m 644 "$ROOT"/udev/*.rules "$D/usr/lib/udev/rules.d/"
install -m 644 "$ROOT"/README.md "$ROOT"/docs/*.md "$DOC/"
install -m 644 "$ROOT/docs/multipath-srp-ublk.conf" "$ROOT/packaging/example.conf" \
    "$ROOT/packaging/example-export.conf" "$DOC/examples/"
# man pages and completions, generated from the binary's own command line
man=$(mktemp -d)
trap 'rm -rf "$man"' EXIT
"$BIN" man "$man"
gzip -9n "$man"/*.8
install -D -m 644 -t "$D/usr/share/man/man8" "$man"/*.8.gz
install -d "$D/usr/share/bash-completion/completions" "$D/usr/share/zsh/vendor-completions" \
    "$D/usr/share/fish/vendor_completions.d"
"$BIN" completions bash > "$D/usr/share/bash-completion/completions/srp-ublk"
"$BIN" completions zsh > "$D/usr/share/zsh/vendor-completions/_srp-ublk"
"$BIN" completions fish > "$D/usr/share/fish/vendor_completions.d/srp-ublk.fish"
