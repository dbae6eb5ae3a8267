# srp-ublk's RPM (packaging/rpm.sh, of the binary under test) on this systemd host, with Debian's
# rpm (no RHEL-family host in the lab: the package's files and its scriptlets under systemd and
# udev are what this shows; --nodeps, as rpm's database here knows none of Debian's libraries):
#  - it installs the package's files and the binary runs
#  - an upgrade (rpm -U --replacepkgs) with a device attached hands the daemon over to the
#    installed binary and the device keeps its data
#  - `rpm -e` with a device attached is refused with a message, the device serves on
#  - `rpm -e` once it is detached, with a target unit enabled: no file of the package left, no
#    unit enabled, no process, no /etc/srp-ublk or /run/srp-ublk
. /usr/lib/srp-lab/suite/lib.sh
ublk_cleanup
RPM=/usr/lib/srp-lab/srp-ublk.rpm
[ -f "$RPM" ] || fail "no $RPM in the lab guest (tests/lab/lab.sh packages it with packaging/rpm.sh)"
# from a host without the Debian package (test 70 purges it; alone, this test does)
DEBIAN_FRONTEND=noninteractive apt-get purge -y srp-ublk >/dev/null 2>&1 || true
rpm -i --nodeps "$RPM" > /tmp/rpm-i.log 2>&1 || { cat /tmp/rpm-i.log; fail "rpm -i $RPM"; }
files=$(rpm -ql srp-ublk | while read -r f; do [ -f "$f" ] && echo "$f"; done)
nfiles=$(echo "$files" | wc -l)
for f in /usr/sbin/srp-ublk /usr/lib/systemd/system/srp-ublk@.service /usr/lib/udev/rules.d/60-srp-ublk.rules \
         /usr/share/man/man8/srp-ublk-add.8.gz /usr/share/zsh/site-functions/_srp-ublk \
         /usr/share/doc/srp-ublk/examples/example.conf /usr/share/licenses/srp-ublk/copyright; do
    echo "$files" | grep -qx "$f" || fail "the RPM has no $f"
done
[ -d /etc/srp-ublk/targets.d ] || fail "the RPM made no /etc/srp-ublk/targets.d"
ok "rpm installed $nfiles files: $(srp-ublk -V | head -1)"
# an upgrade under an attached device: the daemon runs the installed binary again, no data lost
dev=$(ublk_add) || fail "srp-ublk add"
pattern /tmp/p 4
dd if=/tmp/p of="$dev" bs=1M oflag=direct conv=fsync 2>/dev/null || fail "write to $dev"
rpm -U --replacepkgs --nodeps "$RPM" > /tmp/rpm-U.log 2>&1 || { cat /tmp/rpm-U.log; fail "rpm -U $RPM"; }
grep -q "$dev: daemon pid [0-9]* runs the installed binary again" /tmp/rpm-U.log ||
    { cat /tmp/rpm-U.log; fail "the upgrade's %post did not hand $dev's daemon over"; }
ok "rpm -U handed the daemon over: $(grep -o 'serving .* after the signal' /tmp/rpm-U.log)"
expect_eq "$dev read back after the upgrade" "$(sha_range "$dev" 0 4)" "$(sha256sum < /tmp/p | cut -c1-64)"
# an erase under an attached device is refused; the device serves on
rpm -e srp-ublk > /tmp/rpm-e.log 2>&1 && { cat /tmp/rpm-e.log; fail "rpm -e went through with $dev attached"; }
grep -q "srp-ublk: not removed: 1 device(s) attached" /tmp/rpm-e.log ||
    { cat /tmp/rpm-e.log; fail "the refused erase does not say why"; }
rpm -q srp-ublk >/dev/null || fail "srp-ublk is no longer installed after the refused erase"
expect_eq "$dev read back after the refused erase" "$(sha_range "$dev" 0 4)" "$(sha256sum < /tmp/p | cut -c1-64)"
srp-ublk del --all || fail "del"
# erase, with a target's unit enabled
systemctl enable srp-ublk@lab.service 2>/dev/null || fail "systemctl enable srp-ublk@lab"
rpm -e srp-ublk > /tmp/rpm-e.log 2>&1 || { cat /tmp/rpm-e.log; fail "rpm -e"; }
package_gone "rpm -e" "$files"
