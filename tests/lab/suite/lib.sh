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
