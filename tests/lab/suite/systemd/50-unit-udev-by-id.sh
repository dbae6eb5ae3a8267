# srp-ublk as an administrator runs it, in the systemd guest (LAB_BOOT=systemd):
#  - reference: the kernel ib_srp's sd disks of the three LUNs and the by-id names udev gives them
#  - a target file in targets.d and `systemctl start srp-ublk@lab`: three devices; the unit is never
#    active while fewer than three devices are live (sampled every 0.1 s while it starts)
#  - one daemon serves the three devices (one per target port) and logs to the unit's journal, each
#    line about one device starting with its name, the others with the port's, at its syslog
#    priority; `list` says how to find a device's lines
#  - udev (60-srp-ublk.rules) gives each device the by-id names ib_srp's sd disk had (scsi-, wwn-),
#    its own (srp-ublk-) and a by-path link naming the target and LUN; commands take a by-id link
#    as the device
#  - `kill -9` of the port's daemon under a verifying fio: the supervisor exits, systemd restarts
#    the unit, `up` recovers the three devices in one new daemon, fio goes on with 0 errors
#  - `systemctl stop` detaches every device and leaves the unit inactive, not failed
. /usr/lib/srp-lab/suite/lib.sh
ublk_cleanup
U=srp-ublk@lab.service
trap 'show_logs; journalctl -u "$U" --no-pager | tail -40; systemctl stop "$U"; rm -f /etc/srp-ublk/targets.d/lab.conf; ublk_cleanup' EXIT
# dev_of LUN: the srp-ublk device serving LUN; pid_of DEV: its daemon
dev_of() { srp-ublk list | grep " lun $1 " | cut -d' ' -f1; }
pid_of() { srp-ublk list | grep "^$1 " | sed 's/.* pid \([0-9]*\)$/\1/'; }
# live: "N R", devices listed and queues running
live() { echo "$(srp-ublk list | grep -c '^/dev/ublkb') $(queue_states | wc -w)"; }
nrestarts() { systemctl show -p NRestarts --value "$U"; }

udevadm settle
lab-ref-attach >/dev/null || fail "lab-ref-attach"
udevadm settle
mkdir -p /tmp/ref
for s in /sys/block/sd*; do
    l=$(basename "$(readlink "$s/device")"); l=${l##*:}
    props=$(udevadm info -q property -n "/dev/$(basename "$s")")
    echo "$props" | sed -n 's/^ID_SERIAL=//p' > /tmp/ref/serial$l
    echo "$props" | sed -n 's/^ID_WWN_WITH_EXTENSION=//p' > /tmp/ref/wwn$l
    [ -s /tmp/ref/serial$l ] || fail "udev gave ib_srp's $s (LUN $l) no ID_SERIAL"
    [ -L "/dev/disk/by-id/scsi-$(cat /tmp/ref/serial$l)" ] || fail "no by-id link for ib_srp's $s"
    echo "ib_srp LUN $l: $(basename "$s") ID_SERIAL $(cat /tmp/ref/serial$l) WWN $(cat /tmp/ref/wwn$l)"
done
[ -s /tmp/ref/serial2 ] || fail "ib_srp did not give three LUNs: $(ls /sys/block)"
lab-ref-detach || fail "lab-ref-detach"
udevadm settle

mkdir -p /etc/srp-ublk/targets.d
cat > /etc/srp-ublk/targets.d/lab.conf <<CONF
# the lab target, every LUN
target = $SRP_TARGET
lun = all
queues = 2
reconnect_delay = 2
fast_io_fail_tmo = 30
CONF
rm -f /tmp/samples.stop
( while [ ! -e /tmp/samples.stop ]; do echo "$(systemctl is-active "$U") $(live)"; sleep 0.1; done ) > /tmp/samples 2>&1 &
sp=$!
t=$(now)
systemctl start "$U" || fail "systemctl start $U"
echo "systemctl start $U returned after $(since "$t") s"
touch /tmp/samples.stop; wait $sp
expect_eq "unit state" "$(systemctl is-active "$U")" active
expect_eq "devices and running queues" "$(live)" "3 6"
echo "samples while starting: $(sort /tmp/samples | uniq -c | tr '\n' ';')"
grep -v '^active 3 6$' /tmp/samples | grep '^active' && fail "the unit was active before every device was live"
grep -q '^activating' /tmp/samples || echo "note: no sample caught the unit activating"
ok "the unit became active only with 3 devices live"
expect_eq "daemons serving the three devices" "$(srp-ublk list | sed -n 's/^\/dev\/ublkb.* pid //p' | sort -u | wc -l)" 1
expect_contains "list shows the unit" "$(srp-ublk list)" "unit $U"
# the unit's daemons log to the journal, each line naming its device, with its syslog priority
d1=$(dev_of 1); n1=${d1#/dev/}
port=srp-$SRP_SERVICE_GUID-10.77.0.1:5555
expect_contains "list names the daemon's log" "$(srp-ublk list)" \
    "log the journal: journalctl -u $U -g '^($n1|port $port): '"
journalctl -u "$U" -o cat --no-pager | grep -q "^port $port: .*channel 0 logged in" ||
    fail "no line 'port $port: ... channel 0 logged in' in the journal of $U: $(journalctl -u "$U" -o cat --no-pager | tail -20)"
journalctl -u "$U" -p info..info -o cat --no-pager | grep -q "^$n1: .*$d1 is live" ||
    fail "no info line '$n1: ... $d1 is live' in the journal of $U: $(journalctl -u "$U" -o cat --no-pager | tail -20)"
journalctl -u "$U" -p warning -o cat --no-pager | grep "is live" && fail "an info line was filed as a warning"
expect_eq "devices whose daemon logs to the journal" "$(srp-ublk list | grep -c '    log the journal: ')" 3
ok "the daemon logs to the journal: '$n1: ... $d1 is live' at priority info, the port's lines as 'port $port: '"

udevadm settle
for l in 0 1 2; do
    d=$(dev_of $l)
    [ -b "$d" ] || fail "no device for LUN $l: $(srp-ublk list)"
    expect_eq "by-id/srp-ublk-<sd's ID_SERIAL> of LUN $l" \
        "$(readlink -f "/dev/disk/by-id/srp-ublk-$(cat /tmp/ref/serial$l)")" "$d"
    expect_eq "by-id/wwn-<sd's WWN> of LUN $l" "$(readlink -f "/dev/disk/by-id/wwn-$(cat /tmp/ref/wwn$l)")" "$d"
    expect_eq "by-id/scsi-<sd's ID_SERIAL> of LUN $l (ib_srp's name)" \
        "$(readlink -f "/dev/disk/by-id/scsi-$(cat /tmp/ref/serial$l)")" "$d"
    expect_eq "by-path of LUN $l" \
        "$(readlink -f "/dev/disk/by-path/srp-$SRP_SERVICE_GUID-10.77.0.1:5555-lun-$l")" "$d"
done
# a command's device may be named by its by-id link, as fstab and VM definitions name it
w=/dev/disk/by-id/wwn-$(cat /tmp/ref/wwn1)
expect_contains "resize -n $w" "$(srp-ublk resize -n "$w" 2>&1)" "$(dev_of 1): capacity unchanged"

d0=$(dev_of 0); d1=$(dev_of 1); d2=$(dev_of 2)
p0=$(pid_of "$d0")
r0=$(nrestarts)
verify_start "$d0" 64M
sleep 5
t=$(now)
kill -9 "$p0"
i=0
while { [ "$(nrestarts)" = "$r0" ] || [ "$(systemctl is-active "$U")" != active ]; } && [ $i -lt 1200 ]; do
    sleep 0.1; i=$((i + 1))
done
[ "$(nrestarts)" -gt "$r0" ] || fail "systemd did not restart $U within 120 s: $(systemctl status "$U" --no-pager)"
expect_eq "unit state after the restart" "$(systemctl is-active "$U")" active
r=$(wait_running 60) || fail "queues not running after the restart: $(queue_states)"
echo "kill -9 of the port's daemon: unit restarted and active $(since "$t") s later, every queue running"
for l in 0 1 2; do
    d=$(eval echo "\$d$l")
    journalctl -u "$U" --no-pager | grep -q "LUN $l: $d lost its daemon: recovering" ||
        fail "the restarted unit did not recover $d: $(journalctl -u "$U" --no-pager | tail -20)"
done
sleep 5
verify_stop
for l in 0 1 2; do expect_eq "LUN $l's device after the restart" "$(dev_of $l)" "$(eval echo "\$d$l")"; done
p1=$(pid_of "$d1")
[ "$p1" != "$p0" ] || fail "the port's daemon was not replaced"
expect_eq "the recovered devices' daemons" "$(for d in $d0 $d1 $d2; do pid_of $d; done | sort -u | wc -l)" 1

# the sandbox (issue 19): systemd rates the unit at most 4.0 here too, and the daemons it started
# run with three capabilities, out of the OOM killer's way and as IO_FLUSHERs (PF_MEMALLOC_NOIO |
# PF_LOCAL_THROTTLE in /proc/PID/stat's flags)
sec=$(systemd-analyze security --no-pager "$U" | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p')
echo "systemd-analyze security $U: $sec"
awk -v s="$sec" 'BEGIN{exit !(s != "" && s <= 4.0)}' || fail "$U exposure '$sec' (want at most 4.0)"
expect_eq "the daemon's oom_score_adj" "$(cat /proc/$p1/oom_score_adj)" -1000
expect_eq "the daemon's capability bounding set" "$(sed -n 's/^CapBnd:\t//p' /proc/$p1/status)" 0000000001204000
flags=$(cut -d' ' -f9 /proc/$p1/stat)
[ $((flags & 0x180000)) = $((0x180000)) ] || fail "the daemon is not an IO_FLUSHER (flags $flags)"
journalctl -u "$U" --no-pager | grep -E "PR_SET_IO_FLUSHER|oom_score_adj|Operation not permitted" &&
    fail "a daemon met the sandbox"
ok "sandboxed: exposure $sec, CAP_SYS_ADMIN CAP_IPC_LOCK CAP_SYS_RESOURCE, oom_score_adj -1000, IO_FLUSHER"

systemctl stop "$U" || fail "systemctl stop $U"
i=0; while [ -n "$(ls /dev/ublkb* 2>/dev/null)" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
expect_eq "devices after systemctl stop" "$(ls /dev/ublkb* 2>/dev/null | wc -l)" 0
expect_eq "unit state after stop" "$(systemctl is-active "$U")" inactive

# what udev starts when an RDMA device appears (61-srp-ublk-port.rules), under its own sandbox
systemctl start srp-ublk-port@rxe0.service || fail "systemctl start srp-ublk-port@rxe0.service"
i=0; while [ "$(live)" != "3 6" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
expect_eq "devices started through srp-ublk-port@rxe0" "$(live)" "3 6"
expect_eq "unit state started by the port unit" "$(systemctl is-active "$U")" active
systemctl stop "$U" || fail "systemctl stop $U (after the port unit)"
# later tests start from no target file: the port unit (udev) would start this one again
rm -f /etc/srp-ublk/targets.d/lab.conf
trap - EXIT
ublk_cleanup
