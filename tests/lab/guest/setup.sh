# Sourced by /init (busybox ash): the lab's fabric and target, as proven in shared/lab/REPORT.md.
#  - soft-RoCE rxe0 on dummy0 with a fixed MAC (stable GID/GUID across boots), 10.77.0.1/24
#  - or, in a pair of guests (lab.sh pair, LAB_ROLE=target|initiator), rxe0 on the virtio-net link
#    between them: the target at 10.77.0.1 (LIO only), the initiator at 10.77.0.2 (ublk, ib_srp)
#  - LIO ib_srpt: rd_mcp ramdisk LUNs (lun_0 $SRP_LUN_MB MiB, lun_1 32 MiB, lun_2 16 MiB), RDMA/CM
#    listener on port 5555, a node ACL named by the target-side IP (ib_srpt has no demo mode), target
#    port named by the port GUID
#  - ublk_drv loaded; the kernel initiator ib_srp loaded but not attached (lab-ref-attach does that)
# Writes the job's environment (SRP_TARGET, SRP_LUN_BYTES, ...) to /tmp/lab-env.

# Debian's busybox-static prefers its own applets: force the real iproute2 and kmod.
ip() { /usr/bin/ip "$@"; }
modprobe() { /usr/sbin/modprobe "$@"; }

LAB_IP=10.77.0.1
LAB_PEER_IP=10.77.0.2   # the initiator guest's address in a pair
LAB_PORT=5555
LAB_MAC=02:00:00:77:00:01
CFG=/sys/kernel/config/target

waitfor() { _i=0; while [ ! -e "$1" ] && [ $_i -lt $(($2 * 10)) ]; do sleep 0.1; _i=$((_i + 1)); done; [ -e "$1" ]; }

lab_setup_rxe() {
    # 6.12's rxe needs the "crc32" shash (without it 'rdma link add' says ENOENT); from 6.13 rxe uses
    # the crc32 library and the module is gone
    modprobe crc32_generic 2>/dev/null || [ "$(uname -r | cut -d. -f1-2)" != 6.12 ] || return 1
    modprobe crc32_pclmul 2>/dev/null
    modprobe rdma_rxe && modprobe ib_uverbs && modprobe rdma_ucm && modprobe ib_umad || return 1
    case ${LAB_ROLE:-} in
        target|initiator) lab_link || return 1;;
        *)
            modprobe dummy || return 1
            # systemd's modprobe.d sets numdummies=0: no dummy0 comes with the module there
            [ -e /sys/class/net/dummy0 ] || ip link add dummy0 type dummy || return 1
            ip link set dummy0 address $LAB_MAC
            ip addr add $LAB_IP/24 dev dummy0
            ip link set dummy0 up
            LAB_NETDEV=dummy0;;
    esac
    rdma link add rxe0 type rxe netdev $LAB_NETDEV || return 1
    waitfor /sys/class/infiniband/rxe0/ports/1/gids/0 10 || return 1
    rdma link show
}

# lab_link: eth0, the virtio-net link of a pair of guests (qemu gives each its MAC), at this guest's
# address; sets LAB_NETDEV
lab_link() {
    modprobe virtio_net && waitfor /sys/class/net/eth0 10 || return 1
    _ip=$LAB_IP; [ "$LAB_ROLE" = initiator ] && _ip=$LAB_PEER_IP
    ip addr add $_ip/24 dev eth0 && ip link set eth0 up || return 1
    LAB_NETDEV=eth0
}

lab_setup_target() {
    mount -t configfs configfs /sys/kernel/config 2>/dev/null || { modprobe configfs; mount -t configfs configfs /sys/kernel/config; }
    modprobe target_core_mod && modprobe ib_srpt || return 1
    for rd in "0 $SRP_LUN_MB" "1 32" "2 16"; do
        set -- $rd
        mkdir -p $CFG/core/rd_mcp_0/ramdisk$1 || return 1
        echo "rd_pages=$(($2 * 256))" > $CFG/core/rd_mcp_0/ramdisk$1/control   # 4 KiB pages
        echo 1 > $CFG/core/rd_mcp_0/ramdisk$1/enable || return 1
        lab_unit_serial $CFG/core/rd_mcp_0/ramdisk$1 $1 || return 1
    done
    mkdir -p $CFG/srpt
    echo $LAB_PORT > $CFG/srpt/discovery_auth/rdma_cm_port || return 1
    lab_target_port
}

# lab_unit_serial BACKSTORE N: a unit serial for LUN N (as targetcli sets one: LIO then reports VPD
# 0x80 and an NAA designator in 0x83, the LUN's WWN; set before the LUN is exported)
lab_unit_serial() { echo "5e7a1b0$2-0000-4000-8000-000000000000" > "$1/wwn/vpd_unit_serial"; }

# lab_map_lun TPG ACL N BACKSTORE: LUN N of target port TPG is BACKSTORE, mapped in node ACL ACL;
# lab_unmap_lun TPG ACL N NAME undoes it (NAME: the backstore's name), innermost first
lab_map_lun() {
    mkdir -p "$1/lun/lun_$3" && ln -s "$4" "$1/lun/lun_$3/$(basename "$4")" &&
        mkdir -p "$1/acls/$2/lun_$3" && ln -s "$1/lun/lun_$3" "$1/acls/$2/lun_$3/lun_$3"
}
lab_unmap_lun() {
    rm -f "$1/acls/$2/lun_$3/lun_$3" "$1/lun/lun_$3/$4"
    rmdir "$1/acls/$2/lun_$3" "$1/lun/lun_$3"
}

# lab_target_port: LIO's target port on rxe0 (named by its port GUID, the interface ID of GID 0,
# "xxxx:xxxx:xxxx:xxxx") with lun_0 and the ACL; sets TPG. Also used after rxe0 is re-created.
lab_target_port() {
    GUIDNAME=$(cut -d: -f5-8 /sys/class/infiniband/rxe0/ports/1/gids/0)
    TPG=$CFG/srpt/$GUIDNAME/tpgt_1
    # node ACL named by the target-side IP of RDMA/CM logins (REPORT.md gotcha 9)
    for l in 0 1 2; do
        lab_map_lun $TPG $LAB_IP $l $CFG/core/rd_mcp_0/ramdisk$l || return 1
    done
    echo 1 > $TPG/enable || return 1
    echo "target: $TPG lun_0/1/2 -> rd_mcp ramdisk0/1/2 ${SRP_LUN_MB}/32/16 MiB, RDMA/CM port $LAB_PORT, ACL $LAB_IP"
}

# lab_port_back: rxe0 added again and LIO's target port made on it (after `rdma link delete rxe0` and
# lab_target_port_remove); lab_port_restore: whatever of that a test left undone (for traps)
lab_port_back() {
    rdma link add rxe0 type rxe netdev dummy0 && waitfor /sys/class/infiniband/rxe0/ports/1/gids/0 10 &&
        lab_target_port >/dev/null
}
lab_port_restore() {
    [ -e /sys/class/infiniband/rxe0 ] || rdma link add rxe0 type rxe netdev dummy0
    waitfor /sys/class/infiniband/rxe0/ports/1/gids/0 10
    [ -d "$SRP_TPG" ] || lab_target_port >/dev/null
}

# lab_target_port_remove TPG: takes the target port's configuration apart (what is left of it once
# its RDMA device was removed), innermost first
lab_target_port_remove() {
    for l in 0 1 2; do
        lab_unmap_lun "$1" $LAB_IP $l ramdisk$l
    done
    rmdir "$1/acls/$LAB_IP" "$1" "$(dirname "$1")"
}

# lab_export_lun N DEV: LIO exports block device DEV (iblock) as LUN N of the lab target to the lab
# initiator, with its own unit serial; lab_unexport_lun N undoes it (whatever of it exists)
lab_export_lun() {
    _bs=$CFG/core/iblock_$1/lun$1
    mkdir -p $_bs && echo "udev_path=$2" > $_bs/control && echo 1 > $_bs/enable &&
        lab_unit_serial $_bs $1 && lab_map_lun "$SRP_TPG" $LAB_IP $1 $_bs
}
lab_unexport_lun() {
    lab_unmap_lun "$SRP_TPG" $LAB_IP $1 lun$1 2>/dev/null
    rmdir $CFG/core/iblock_$1/lun$1 $CFG/core/iblock_$1 2>/dev/null
    true
}

# lab_path_b: a second fabric path to the same LUNs (the multipath tests): a veth pair vethA
# (10.77.1.1, rxeA: LIO's second target port) -- vethB (10.77.1.2, rxeB: the initiator side). RoCE
# between two rxe devices in one namespace needs accept_local=1 and rp_filter=0 (the ARP request's
# sender address is local), and the login must bind src=10.77.1.2 (shared/lab/REPORT.md). Sets
# SRP_TARGET_B (with initiator_ext 0x11, so that no login of one path touches the other's nexus)
# and TPG_B.
lab_path_b() {
    ip link add vethA type veth peer name vethB || return 1
    ip link set vethA address 02:00:00:77:01:01 && ip link set vethB address 02:00:00:77:01:02 || return 1
    ip addr add 10.77.1.1/24 dev vethA && ip addr add 10.77.1.2/24 dev vethB || return 1
    # under systemd, udev applies sysctl.d (rp_filter=2) to a new netdev: let it finish first
    command -v udevadm >/dev/null && udevadm settle
    for i in all default vethA vethB; do
        echo 1 > /proc/sys/net/ipv4/conf/$i/accept_local; echo 0 > /proc/sys/net/ipv4/conf/$i/rp_filter
    done
    ip link set vethA up && ip link set vethB up || return 1
    rdma link add rxeA type rxe netdev vethA && rdma link add rxeB type rxe netdev vethB || return 1
    waitfor /sys/class/infiniband/rxeA/ports/1/gids/0 10 && waitfor /sys/class/infiniband/rxeB/ports/1/gids/0 10 || return 1
    TPG_B=$CFG/srpt/$(cut -d: -f5-8 /sys/class/infiniband/rxeA/ports/1/gids/0)/tpgt_1
    lab_map_lun "$TPG_B" 10.77.1.1 0 $CFG/core/rd_mcp_0/ramdisk0 || return 1
    echo 1 > "$TPG_B/enable" || return 1
    SRP_TARGET_B="id_ext=$SRP_SERVICE_GUID,ioc_guid=$SRP_SERVICE_GUID,dest=10.77.1.1:5555,src=10.77.1.2,initiator_ext=0000000000000011"
    echo "path B: rxeB (vethB 10.77.1.2) -> rxeA (vethA 10.77.1.1): $TPG_B lun_0 -> ramdisk0, ACL 10.77.1.1"
}

lab_setup() {
    set -x
    modprobe ublk_drv && waitfor /dev/ublk-control 5 || echo "warning: ublk_drv did not load"
    if [ "$LAB_SETUP" = minimal ]; then set +x; return 0; fi
    lab_setup_rxe || { set +x; echo "rxe setup failed"; dmesg | tail -20; return 1; }
    if [ "${LAB_ROLE:-}" != initiator ]; then
        lab_setup_target || { set +x; echo "target setup failed"; dmesg | tail -20; return 1; }
    fi
    if [ "${LAB_ROLE:-}" != target ]; then
        modprobe sd_mod && modprobe ib_srp || return 1
        waitfor /sys/class/infiniband_srp/srp-rxe0-1/add_target 10 || return 1
    fi
    set +x
    if [ "${LAB_ROLE:-}" = initiator ]; then
        # the target guest's environment, which the host put in the share
        cp /lab/target-env /tmp/lab-env || return 1
        cat /tmp/lab-env
        return 0
    fi
    SG=$(cat /sys/module/ib_srpt/parameters/srpt_service_guid); SG=${SG#0x}
    SG=$(printf '%016x' 0x"$SG")
    cat > /tmp/lab-env <<EOF
export SRP_TARGET="id_ext=$SG,ioc_guid=$SG,dest=$LAB_IP:$LAB_PORT"
export SRP_LUN_BYTES=$((SRP_LUN_MB * 1048576))
export SRP_SERVICE_GUID=$SG
export SRP_TPG=$TPG
export LAB_RDMA_DEV=rxe0
EOF
    cat /tmp/lab-env
}
