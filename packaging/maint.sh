# srp-ublk's package scripts, one file for both packaging systems: deb.sh and rpm.sh put
# "#!/bin/sh" and "SCRIPT=<which>" in front of it to make the Debian maintainer scripts
# (postinst, prerm, postrm) and the RPM scriptlets (%post, %preun, %postun). What they do:
#  - install or upgrade: systemd and udev learn of the units and rules; nothing is enabled or
#    started (the administrator attaches targets: systemctl enable --now srp-ublk@NAME); on an
#    upgrade, daemons and vhost-user-blk export servers already running re-execute the new binary
#    (`srp-ublk upgrade --all`: their devices and VMs' disks pause, no I/O error);
#  - removal: refused while devices are attached or exports served (the disks would go from under
#    whatever uses them); an upgrade goes on;
#  - purge (Debian) or erase (RPM, which has no separate purge): the units' enabled instances, the
#    runtime directory (state files and daemon logs) and /etc/srp-ublk where it holds no target
#    file of the administrator's are removed too.
set -e

reload() {
    if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
    if [ -d /run/udev ] && command -v udevadm >/dev/null; then udevadm control --reload || true; fi
}

hand_over() {
    if [ "$(srp-ublk list 2>/dev/null | grep -cE '^/dev/ublkb|^export .*vhost-user-blk')" -gt 0 ]; then
        srp-ublk upgrade --all || echo "srp-ublk: the running daemons still run the old binary; 'srp-ublk upgrade --all' moves them (the reason it failed is above)" >&2
    fi
}

refuse_while_attached() {
    devs=$(srp-ublk list 2>/dev/null | grep -c '^/dev/ublkb' || true)
    if [ "${devs:-0}" -gt 0 ] || pidof srp-ublk >/dev/null 2>&1; then
        echo "srp-ublk: not removed: ${devs:-0} device(s) attached, srp-ublk processes running (pids: $(pidof srp-ublk || true))." >&2
        echo "srp-ublk: detach them first (systemctl stop 'srp-ublk@*', srp-ublk del --all, and stop any 'srp-ublk serve': systemctl stop 'srp-ublk-serve@*'), then remove the package again." >&2
        exit 1
    fi
}

purge() {
    # the administrator's enabled instances of the package's units (srp-ublk@NAME), now dangling
    find /etc/systemd/system -type l \( -name 'srp-ublk@*.service' -o -name 'srp-ublk-port@*.service' \
        -o -name 'srp-ublk-serve@*.service' \) -delete 2>/dev/null || true
    rm -rf /run/srp-ublk
    rmdir /etc/srp-ublk/targets.d /etc/srp-ublk/exports.d 2>/dev/null || true
    rmdir /etc/srp-ublk 2>/dev/null || true
}

# Debian passes the action ("configure", "remove", "purge", ...); RPM passes how many versions of
# the package remain installed once this one is done (0: erase, 1 in %preun/%postun: an upgrade,
# 1 in %post: a first install, 2 or more: an upgrade).
case "$SCRIPT:$1" in
deb-postinst:configure) reload; [ -z "$2" ] || hand_over;;
rpm-post:*) reload; [ "$1" -lt 2 ] || hand_over;;
deb-prerm:remove | deb-prerm:deconfigure | rpm-preun:0) refuse_while_attached;;
deb-postrm:purge | rpm-postun:0) purge; reload;;
deb-postrm:remove) reload;;
esac
exit 0
