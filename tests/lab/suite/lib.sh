# Sourced by suite tests: small helpers. Tests assert on data, not only on exit codes.
set -u
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
ok() { echo "ok: $*"; }
# expect_eq WHAT GOT WANT
expect_eq() { [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"; ok "$1 = $3"; }
# expect_contains WHAT HAYSTACK NEEDLE
expect_contains() { case "$2" in *"$3"*) ok "$1 contains '$3'";; *) fail "$1 does not contain '$3': $2";; esac; }
# pattern FILE MIB: random bytes to write and compare
pattern() { dd if=/dev/urandom of="$1" bs=1M count="$2" 2>/dev/null; }
# srp-ublk helpers
# ublk_add [ARGS...]: srp-ublk add on the lab target; prints the device path
ublk_add() { srp-ublk add --target "$SRP_TARGET" "$@"; }
# ublk_cleanup: delete every srp-ublk device and the reference session (for traps)
ublk_cleanup() { srp-ublk del --all >/dev/null 2>&1; lab-ref-detach >/dev/null 2>&1; true; }
# show_logs: the daemon logs, for failure diagnosis
show_logs() { for f in /run/srp-ublk/logs/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done; }
# sha FILE-or-DEV [SKIP_MIB COUNT_MIB]: sha256 of a range read with O_DIRECT
sha_range() { dd if="$1" bs=1M skip="$2" count="$3" iflag=direct 2>/dev/null | sha256sum | cut -c1-64; }
