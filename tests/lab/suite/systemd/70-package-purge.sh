# srp-ublk's Debian package, as apt installed it at boot (lab-install.service), taken out again:
#  - it is installed (dpkg: "install ok installed") and its files are where the package put them
#  - `apt-get remove` with a device attached is refused with a message, and the device keeps serving
#  - `apt-get purge` once it is detached, with a target unit enabled: no file of the package left,
#    no srp-ublk unit known to systemd or enabled, no srp-ublk process, no /run/srp-ublk
. /usr/lib/srp-lab/suite/lib.sh
ublk_cleanup
st=$(dpkg-query -W -f='${Status} ${Version}' srp-ublk 2>/dev/null) || { cat /var/log/lab-apt-install.log; fail "srp-ublk is not a package here"; }
expect_contains "dpkg's status" "$st" "install ok installed"
files=$(dpkg -L srp-ublk | while read -r f; do [ -f "$f" ] && echo "$f"; done)
nfiles=$(echo "$files" | wc -l)
for f in /usr/sbin/srp-ublk /usr/lib/systemd/system/srp-ublk@.service /usr/lib/udev/rules.d/60-srp-ublk.rules \
         /usr/share/man/man8/srp-ublk-add.8.gz /usr/share/bash-completion/completions/srp-ublk \
         /usr/share/doc/srp-ublk/examples/example.conf /usr/share/doc/srp-ublk/copyright; do
    echo "$files" | grep -qx "$f" || fail "the package has no $f"
done
ok "the package installed $nfiles files: $(srp-ublk -V | head -1)"
# a removal under an attached device is refused; the device serves on
dev=$(ublk_add) || fail "srp-ublk add"
pattern /tmp/p 4
dd if=/tmp/p of="$dev" bs=1M oflag=direct conv=fsync 2>/dev/null || fail "write to $dev"
DEBIAN_FRONTEND=noninteractive apt-get remove -y srp-ublk > /tmp/remove.log 2>&1 &&
    { cat /tmp/remove.log; fail "apt-get remove went through with $dev attached"; }
grep -q "srp-ublk: not removed: 1 device(s) attached" /tmp/remove.log ||
    { cat /tmp/remove.log; fail "the refused removal does not say why"; }
expect_contains "dpkg's status after the refused removal" "$(dpkg-query -W -f='${Status}' srp-ublk)" "install ok installed"
expect_eq "$dev read back after the refused removal" "$(sha_range "$dev" 0 4)" "$(sha256sum < /tmp/p | cut -c1-64)"
srp-ublk del --all || fail "del"
# purge, with a target's unit enabled
systemctl enable srp-ublk@lab.service 2>/dev/null || fail "systemctl enable srp-ublk@lab"
DEBIAN_FRONTEND=noninteractive apt-get purge -y srp-ublk > /tmp/purge.log 2>&1 || { cat /tmp/purge.log; fail "apt-get purge"; }
package_gone purge "$files"
