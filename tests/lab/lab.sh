#!/bin/bash
# The srp-ublk lab: Debian's 6.12 kernel booted under qemu (TCG) with ublk_drv, soft-RoCE (rdma_rxe),
# LIO's SRP target (ib_srpt) on a ramdisk LUN and the kernel's own SRP initiator (ib_srp) as reference.
#
# usage: tests/lab/lab.sh prep            install host packages, download + unpack the kernel (cached)
#        tests/lab/lab.sh image           prep + build the cached base initramfs
#        tests/lab/lab.sh run FILE        run shell script FILE inside a fresh guest; exits with its status
#        tests/lab/lab.sh pair FILE       run FILE in an initiator guest whose target (LIO) is in a second
#                                         guest, RoCE over a virtual link between them (run_pair)
#        tests/lab/lab.sh test            run the end-to-end suite: tests/lab/suite in one guest, then
#                                         tests/lab/suite/systemd in a systemd guest (LAB_BOOT=systemd)
#                                         and tests/lab/suite/boot in one set up at boot (LAB_SETUP=early),
#                                         tests/lab/suite/pair in the initiator guest of a pair
#        tests/lab/lab.sh demo            boot, show the target and attach it (tests/lab/demo.sh)
#        tests/lab/lab.sh selftest        prove lab-run propagates exit codes (a script exiting 3 -> 3)
#
# environment (all optional):
#   LAB_TIMEOUT   hard limit for one guest run in seconds (default 1500); qemu is killed after it
#   LAB_MEM       guest memory (default 3072M)        LAB_SMP    guest vCPUs (default 2)
#   LAB_TARGET_SMP, LAB_TARGET_MEM  the target guest of `pair` (default 1 vCPU, 1024M)
#   SRP_LUN_MB    size of the LIO ramdisk LUN (default 256)
#   LAB_SETUP     full (default: rxe + LIO target + ib_srp) or minimal (boot only; no fabric), or
#                 early (LAB_BOOT=systemd: the full setup by a unit at boot, srp-ublk@boot enabled)
#   LAB_BOOT      init (default: busybox /init, no init system) or systemd (a Debian root made by
#                 mmdebstrap boots systemd and udev; srp-ublk's units and rules installed)
#   KPKG          kernel package to use instead of the newest 6.12 from bookworm-backports
#   LAB_KERNEL    6.12 (default) or new: the newest 6.18 (LTS) from trixie-backports, whose ublk can
#                 resize a live device (UPDATE_SIZE); `test` also boots it for $NEW_KERNEL_TESTS
#   LAB_NEW_KSERIES  the series LAB_KERNEL=new takes from trixie-backports (default 6.18; e.g. 7.3,
#                 whose ublk has batch I/O commands, UBLK_F_BATCH_IO)
#   LAB_ONLY      with 'test': run only the suite tests whose name contains this
#   SRP_UBLK_BIN  srp-ublk binary to put in the guest (default target/release/srp-ublk, which must be
#                 newer than the sources: lab.sh does not build, `just lab-test` does)
#   LAB_QEMU_EXTRA  more qemu options, split on blanks (tests/lab/vm/run.sh: a virtio-blk disk)
#
# Everything is cached under target/lab/ (kernel .deb, unpacked kernel, base initramfs); the files
# a guest script writes to $LAB_OUT come back under target/lab/out/ (target/lab/out/systemd/ for
# LAB_BOOT=systemd).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT_DIR=$(cd "$HERE/../.." && pwd)
LAB=${LAB_DIR:-$ROOT_DIR/target/lab}
APTDIR=$LAB/apt
LAB_TIMEOUT=${LAB_TIMEOUT:-1500}
LAB_MEM=${LAB_MEM:-3072M}
LAB_SMP=${LAB_SMP:-2}
LAB_TARGET_SMP=${LAB_TARGET_SMP:-1}
LAB_TARGET_MEM=${LAB_TARGET_MEM:-1024M}
SRP_LUN_MB=${SRP_LUN_MB:-256}
LAB_SETUP=${LAB_SETUP:-full}
LAB_BOOT=${LAB_BOOT:-init}
BIN_GIVEN=${SRP_UBLK_BIN:+1}
SRP_UBLK_BIN=${SRP_UBLK_BIN:-$ROOT_DIR/target/release/srp-ublk}
HOSTILE_BIN=${HOSTILE_BIN:-$(dirname "$SRP_UBLK_BIN")/examples/hostile_target}
KSERIES=6.12
LAB_KERNEL=${LAB_KERNEL:-6.12}
NEW_KSERIES=${LAB_NEW_KSERIES:-6.18}
NEW_KERNEL_INDEX=http://deb.debian.org/debian/dists/trixie-backports/main/binary-amd64/Packages.xz
# suite tests with more to show on the new kernel (test 36: a live resize); `test` runs them there too
NEW_KERNEL_TESTS=36-capacity-change

# Host packages: qemu-system-x86 must match the image's qemu-utils, which comes from bookworm-backports.
HOST_PKGS="qemu-system-x86 qemu-utils busybox-static ibverbs-utils ibverbs-providers rdmacm-utils fio
           iproute2 kmod cpio gzip xz-utils zstd perftest e2fsprogs libnbd-bin linux-perf strace elfutils
           mmdebstrap dmsetup nbdkit nbd-client"
APTO=(-o "Dir::Etc::SourceList=$APTDIR/sources.list" -o Dir::Etc::SourceParts=/nonexistent
      -o "Dir::State::Lists=$APTDIR/lists" -o "Dir::Cache=$APTDIR/cache")

log() { echo "lab: $*" >&2; }
die() { echo "lab: error: $*" >&2; exit 2; }

# ------------------------------------------------------------------------------------------- prep
apt_private() {   # a private apt configuration: bookworm + security + backports; /etc/apt is untouched
    mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial"
    cat > "$APTDIR/sources.list" <<EOF
deb http://deb.debian.org/debian bookworm-backports main
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
    # refresh the lists once per day at most
    if [ -z "$(find "$APTDIR/lists" -name '*bookworm-backports_InRelease' -mtime -1 2>/dev/null)" ]; then
        log "updating the lab's private apt lists (bookworm, security, backports)"
        apt-get "${APTO[@]}" update >"$APTDIR/update.log" 2>&1 ||
            die "apt-get update for the lab failed (network to deb.debian.org?): see $APTDIR/update.log"
    fi
}

host_packages() {
    local missing=() p
    for p in $HOST_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    ((${#missing[@]})) || return 0
    [ "$(id -u)" = 0 ] || die "missing host packages: ${missing[*]} (run as root, or apt-get install them)"
    log "installing host packages: ${missing[*]}"
    apt_private
    # qemu-system-x86 from backports: the image's qemu-utils is the backports build and the two must match
    local args=() q
    # (apt takes only the named package from backports; the dependencies whose bookworm versions are too
    # old are named too)
    for q in "${missing[@]}"; do
        case $q in
            qemu-system-x86) args+=("$q/bookworm-backports" qemu-system-common/bookworm-backports
                                    qemu-system-data/bookworm-backports seabios/bookworm-backports);;
            qemu-*) args+=("$q/bookworm-backports");;
            *) args+=("$q");;
        esac
    done
    DEBIAN_FRONTEND=noninteractive apt-get "${APTO[@]}" install -y --no-install-recommends "${args[@]}" \
        >"$LAB/host-install.log" 2>&1 || die "apt-get install failed: see $LAB/host-install.log"
}

pick_new_kernel() {   # LAB_KERNEL=new: KPKG and NEW_KURL, the newest $NEW_KSERIES in trixie-backports
    local cached
    cached=$( (ls "$LAB/debs" 2>/dev/null || true) | sed -n "s/^\(linux-image-$NEW_KSERIES[^_]*+deb13-amd64\)_.*\.deb$/\1/p" | sort -V | tail -1)
    if [ -n "$cached" ] && [ -z "${LAB_REFRESH:-}" ]; then KPKG=$cached; return; fi
    log "looking up the newest linux-image-$NEW_KSERIES in trixie-backports"
    local pkgs line
    # the index once, as "PACKAGE FILENAME" lines
    pkgs=$(curl -fsSL -m 120 "$NEW_KERNEL_INDEX" | xz -d | awk '
        /^Package: /{p=$2; f=""} /^Filename: /{f=$2} /^$/{ if (p != "" && f != "") print p, f; p="" }') ||
        die "could not read $NEW_KERNEL_INDEX (network to deb.debian.org?)"
    # the newest image package of the series
    line=$(printf '%s\n' "$pkgs" | awk -v s="$NEW_KSERIES" '$1 ~ "^linux-image-" s "\\.[0-9]+\\+deb13-amd64$"' |
        sort -V | tail -1)
    [ -n "$line" ] || die "no linux-image-$NEW_KSERIES.*+deb13-amd64 in trixie-backports"
    KPKG=${line%% *}; NEW_KURL=http://deb.debian.org/debian/${line#* }
    # from 6.19 on linux-image-* is a package of dependencies: the kernel is in linux-binary-*,
    # its modules in linux-modules-*, modules.order and modules.builtin in linux-base-*
    local ver=${KPKG#linux-image-}
    NEW_KURLS=$(printf '%s\n' "$pkgs" | awk -v v="$ver" '
        $1 == "linux-binary-" v || $1 == "linux-modules-" v || $1 == "linux-base-" v {
            print "http://deb.debian.org/debian/" $2 }')
}

pick_kernel() {
    if [ -n "${KPKG:-}" ]; then return; fi
    if [ "$LAB_KERNEL" = new ]; then pick_new_kernel; return; fi
    local cached
    cached=$( (ls "$LAB/debs" 2>/dev/null || true) | sed -n "s/^\(linux-image-$KSERIES[^_]*-amd64\)_.*\.deb$/\1/p" | sort -V | tail -1)
    if [ -n "$cached" ] && [ -z "${LAB_REFRESH:-}" ]; then KPKG=$cached; return; fi
    apt_private
    KPKG=$( (apt-cache "${APTO[@]}" pkgnames "linux-image-$KSERIES" 2>/dev/null || true) |
           (grep -E "^linux-image-$KSERIES\.[0-9]+\+deb12-amd64$" || true) | sort -V | tail -1)
    [ -n "$KPKG" ] || die "no linux-image-$KSERIES.*-amd64 in bookworm-backports (see $APTDIR/update.log)"
}

kernel() {
    pick_kernel
    mkdir -p "$LAB/debs" "$LAB/kernels"
    if ! ls "$LAB/debs/${KPKG}"_*.deb >/dev/null 2>&1 && [ -n "${NEW_KURL:-}" ]; then
        local url
        # the parts first: a cached linux-image-* says they are all there
        for url in ${NEW_KURLS:-} "$NEW_KURL"; do
            log "downloading ${url##*/}"
            curl -fsSL -m 900 -o "$LAB/debs/${url##*/}.tmp" "$url" >"$LAB/download.log" 2>&1 ||
                die "could not download $url: see $LAB/download.log"
            mv "$LAB/debs/${url##*/}.tmp" "$LAB/debs/${url##*/}"
        done
    fi
    if ! ls "$LAB/debs/${KPKG}"_*.deb >/dev/null 2>&1; then
        apt_private
        log "downloading $KPKG (apt-get download, not installed)"
        (cd "$LAB/debs" && apt-get "${APTO[@]}" download "$KPKG" >"$LAB/download.log" 2>&1) ||
            die "could not download $KPKG: see $LAB/download.log"
    fi
    KDIR=$LAB/kernels/$KPKG
    if [ ! -d "$KDIR/lib/modules" ]; then
        log "unpacking $KPKG"
        rm -rf "$KDIR.tmp"; mkdir -p "$KDIR.tmp"
        local deb ver=${KPKG#linux-image-}
        for deb in "$LAB/debs/${KPKG}"_*.deb "$LAB/debs/linux-binary-${ver}"_*.deb \
                   "$LAB/debs/linux-modules-${ver}"_*.deb "$LAB/debs/linux-base-${ver}"_*.deb; do
            [ ! -e "$deb" ] || dpkg-deb -x "$deb" "$KDIR.tmp"
        done
        # trixie's packages are merged-/usr: modules under usr/lib/modules
        [ -d "$KDIR.tmp/lib/modules" ] || ln -s usr/lib "$KDIR.tmp/lib"
        local kv
        kv=$(ls "$KDIR.tmp/lib/modules")
        # the split packages put the kernel beside its modules, not in /boot
        if [ ! -e "$KDIR.tmp/boot/vmlinuz-$kv" ] && [ -e "$KDIR.tmp/lib/modules/$kv/vmlinuz" ]; then
            mkdir -p "$KDIR.tmp/boot"
            cp "$KDIR.tmp/lib/modules/$kv/vmlinuz" "$KDIR.tmp/boot/vmlinuz-$kv"
        fi
        depmod -b "$KDIR.tmp" "$kv"
        rm -rf "$KDIR"; mv "$KDIR.tmp" "$KDIR"
    fi
    KV=$(ls "$KDIR/lib/modules")
}

prep() {
    mkdir -p "$LAB"
    host_packages
    kernel
}

pack() {   # pack OUT: $STAGE as a gzipped newc cpio archive at OUT (written whole or not at all); $STAGE goes
    (cd "$STAGE" && find . | cpio -o -H newc --quiet | gzip -1) > "$1.tmp"
    mv "$1.tmp" "$1"
    rm -rf "$STAGE"
}

# ------------------------------------------------------------------------------ kernel modules
stage_modules() {   # stage_modules ROOT: the dependency closure of $GUEST_MODULES, decompressed, depmod'ed
    local MD=$1/usr/lib/modules/$KV m ko rel
    mkdir -p "$MD"
    for m in $GUEST_MODULES; do
        modprobe -d "$KDIR" -S "$KV" --show-depends "$m" 2>/dev/null || log "note: module $m not in $KPKG (built in or absent)"
    done | awk '$1=="insmod"{print $2}' | sort -u | while read -r ko; do
        rel=${ko#"$KDIR"/lib/modules/"$KV"/}
        mkdir -p "$MD/$(dirname "$rel")"
        case $ko in
            *.xz) xz -dc "$ko" > "$MD/${rel%.xz}";;
            *.zst) zstd -qdc "$ko" > "$MD/${rel%.zst}";;
            *) cp "$ko" "$MD/$rel";;
        esac
    done
    cp "$KDIR/lib/modules/$KV"/modules.{order,builtin,builtin.modinfo} "$MD/"
    depmod -b "$1" "$KV"
}

# ------------------------------------------------------------------------------ base initramfs
# The base image holds everything but the project's own files; it is cached by a key over the kernel,
# this script and the guest files, so a second run neither downloads nor rebuilds it.
GUEST_TOOLS="/usr/bin/kmod /usr/bin/ip /usr/sbin/ip /usr/bin/rdma /usr/bin/ibv_devices /usr/bin/ibv_devinfo
    /usr/bin/ibv_rc_pingpong /usr/bin/rping /usr/bin/fio /usr/sbin/mke2fs /usr/sbin/e2fsck /usr/bin/qemu-io
    /usr/bin/nbdinfo /usr/bin/nbdcopy /usr/bin/ib_write_bw /usr/bin/ib_read_bw /usr/bin/ib_send_bw
    /usr/bin/ib_send_lat /usr/bin/ib_read_lat /usr/bin/ib_write_lat /usr/bin/perf /usr/bin/strace
    /usr/bin/eu-stack /usr/sbin/dmsetup /usr/bin/ss /usr/bin/qemu-img /usr/bin/nbdkit
    /usr/lib/x86_64-linux-gnu/nbdkit/plugins/nbdkit-memory-plugin.so /usr/sbin/nbd-client
    /usr/sbin/blkdiscard /usr/sbin/fstrim"
GUEST_MODULES="configfs 9p 9pnet_virtio virtio_pci ublk_drv rdma_rxe ib_uverbs rdma_ucm ib_umad ib_srpt ib_srp
    target_core_mod target_core_file target_core_iblock sd_mod sg veth dummy nbd ext4 dm_multipath loop
    virtio_blk virtio_net
    dm_service_time dm_round_robin dm_queue_length
    crc32_generic crc32_pclmul crc32c_generic crc32c_intel"

copy_file() {   # copy a host file (following links) to the same real path in $STAGE, keep the link name
    local src=$1 real
    real=$(realpath "$src")
    if [ ! -e "$STAGE$real" ]; then mkdir -p "$STAGE$(dirname "$real")"; cp -L "$src" "$STAGE$real"; fi
    if [ "$src" != "$real" ] && [ ! -e "$STAGE$src" ] && [ ! -L "$STAGE$src" ]; then
        mkdir -p "$STAGE$(dirname "$src")"; ln -s "$real" "$STAGE$src"
    fi
}
copy_with_libs() {
    local f lib
    for f in "$@"; do
        [ -e "$f" ] || continue
        copy_file "$f"
        for lib in $(ldd "$f" 2>/dev/null | grep -o '/[^ )]*'); do copy_file "$lib"; done
    done
}

base_key() {
    { echo "$KPKG $HOST_PKGS $GUEST_TOOLS $GUEST_MODULES"; declare -f stage_modules copy_file copy_with_libs image
      dpkg-query -W busybox-static fio rdmacm-utils ibverbs-providers qemu-utils libnbd-bin perftest nbdkit \
          nbd-client util-linux 2>/dev/null
    } | sha256sum | cut -c1-12
}

image() {
    prep
    BASE=$LAB/base-$KV-$(base_key).cpio.gz
    [ -s "$BASE" ] && return 0
    local t0=$SECONDS m
    log "building the base initramfs for $KV"
    STAGE=$LAB/stage.base
    rm -rf "$STAGE"; mkdir -p "$STAGE"/usr/{bin,sbin,lib,lib64} "$STAGE"/{proc,sys,dev,tmp,run,etc,root,lab,lab-out,mnt}
    ln -s usr/bin "$STAGE/bin"; ln -s usr/sbin "$STAGE/sbin"; ln -s usr/lib "$STAGE/lib"; ln -s usr/lib64 "$STAGE/lib64"
    cp /bin/busybox "$STAGE/usr/bin/busybox"
    ln -s busybox "$STAGE/usr/bin/sh"   # scripts' #!/bin/sh
    # shellcheck disable=SC2086
    copy_with_libs $GUEST_TOOLS
    for m in modprobe insmod lsmod rmmod depmod modinfo; do ln -sf ../bin/kmod "$STAGE/usr/sbin/$m"; done
    ln -sf mke2fs "$STAGE/usr/sbin/mkfs.ext4"
    # the rxe verbs provider is dlopen'ed: ldd of the tools does not see it
    copy_with_libs /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so
    mkdir -p "$STAGE/etc/libibverbs.d"; cp /etc/libibverbs.d/rxe.driver "$STAGE/etc/libibverbs.d/"
    cp /etc/services /etc/protocols /etc/mke2fs.conf "$STAGE/etc/" 2>/dev/null || true
    echo 'root:x:0:0:root:/root:/bin/sh' > "$STAGE/etc/passwd"; echo 'root:x:0:' > "$STAGE/etc/group"
    echo 'hosts: files' > "$STAGE/etc/nsswitch.conf"; echo '127.0.0.1 localhost' > "$STAGE/etc/hosts"
    stage_modules "$STAGE"
    pack "$BASE"
    log "base initramfs $(du -h "$BASE" | cut -f1) built in $((SECONDS - t0)) s"
}

# ------------------------------------------------------------------------------ systemd root
# LAB_BOOT=systemd boots a Debian root made by mmdebstrap (systemd, udev, multipath-tools, rdma-core,
# fio) as the initramfs itself (rdinit=/sbin/init): the operations tests run srp-ublk the way an
# administrator does, through its systemd units and udev rules. Cached by a key over the package list,
# the kernel and this code; a rebuild takes about a minute.
SYSROOT_PKGS="apt systemd systemd-sysv udev dbus kmod iproute2 rdma-core ibverbs-providers ibverbs-utils
    rdmacm-utils fio multipath-tools e2fsprogs procps psmisc elfutils sysvinit-utils rpm libnbd-bin"
# units that only slow the guest down or wait for a terminal nobody opens
SYSROOT_MASK="getty@tty1.service serial-getty@ttyS0.service e2scrub_all.timer e2scrub_reap.service
    dpkg-db-backup.timer fstrim.timer systemd-pstore.service systemd-timesyncd.service"

sysroot_key() {
    { echo "$KPKG $SYSROOT_PKGS $SYSROOT_MASK $GUEST_MODULES"; declare -f stage_modules sysroot; } | sha256sum | cut -c1-12
}

sysroot() {
    prep
    SYSROOT=$LAB/sysroot-$KV-$(sysroot_key).cpio.gz
    [ -s "$SYSROOT" ] && return 0
    local t0=$SECONDS u
    log "building the systemd root (mmdebstrap bookworm: $(echo $SYSROOT_PKGS | tr -s ' ' ' '))"
    STAGE=$LAB/stage.sysroot
    rm -rf "$STAGE"
    mmdebstrap --variant=essential --mode=root --include="$(echo $SYSROOT_PKGS | tr -s ' ' ',')" \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' bookworm "$STAGE" \
        "deb http://deb.debian.org/debian bookworm main" \
        "deb http://deb.debian.org/debian-security bookworm-security main" >"$LAB/sysroot.log" 2>&1 ||
        die "mmdebstrap failed: see $LAB/sysroot.log"
    stage_modules "$STAGE"
    : > "$STAGE/etc/machine-id"   # systemd makes one at boot
    echo lab > "$STAGE/etc/hostname"
    echo '127.0.0.1 localhost lab' > "$STAGE/etc/hosts"
    for u in $SYSROOT_MASK; do ln -sf /dev/null "$STAGE/etc/systemd/system/$u"; done
    mkdir -p "$STAGE"/{lab,lab-out}
    pack "$SYSROOT"
    log "systemd root $(du -h "$SYSROOT" | cut -f1) built in $((SECONDS - t0)) s"
}

# ------------------------------------------------------------------------------ project overlay
overlay() {   # the project's own files: the job runner, helpers, the suite, srp-ublk; rebuilt every run
    local out=$1 lib
    [ -x "$SRP_UBLK_BIN" ] || die "no srp-ublk binary at $SRP_UBLK_BIN: run 'cargo build --release' first"
    # a binary older than the sources would test code that is not there any more
    if [ -z "${BIN_GIVEN:-}" ]; then
        local newer
        newer=$(cd "$ROOT_DIR" && find src Cargo.toml Cargo.lock -newer "$SRP_UBLK_BIN" -print -quit 2>/dev/null)
        [ -z "$newer" ] || die "$SRP_UBLK_BIN is older than $newer: run 'cargo build --release' first (just lab-test does), or name a binary with SRP_UBLK_BIN="
    fi
    STAGE=$LAB/stage.overlay
    rm -rf "$STAGE"; mkdir -p "$STAGE"/usr/{bin,sbin,lib,lib64} "$STAGE/usr/local/bin" "$STAGE/usr/lib/srp-lab"
    # the same merged-/usr links as the base: the kernel replaces an entry of another type when it
    # unpacks the second archive, so a real /lib here would hide the base's /lib/modules
    ln -s usr/bin "$STAGE/bin"; ln -s usr/sbin "$STAGE/sbin"; ln -s usr/lib "$STAGE/lib"; ln -s usr/lib64 "$STAGE/lib64"
    install -m 755 "$HERE/guest/lab-ref-attach" "$HERE/guest/lab-ref-detach" "$HERE/guest/lab-target" \
        "$HERE/guest/lab-prof" "$STAGE/usr/local/bin/"
    install -m 644 "$HERE/guest/setup.sh" "$HERE/guest/run-job.sh" "$STAGE/usr/lib/srp-lab/"
    cp -r "$HERE/suite" "$STAGE/usr/lib/srp-lab/suite"
    if [ "$LAB_BOOT" = systemd ]; then
        # srp-ublk as its Debian package (packaging/deb.sh, of the binary under test): installed by
        # apt at boot (lab-install.service, before the job), or, for a guest that attaches a target
        # at boot (LAB_SETUP=early), its files unpacked here so that the enabled unit is there
        DEB_OUT=$LAB/deb DEB_LINT=0 SRP_UBLK_BIN=$SRP_UBLK_BIN bash "$ROOT_DIR/packaging/deb.sh" >/dev/null ||
            die "packaging $SRP_UBLK_BIN failed (bash packaging/deb.sh)"
        local deb
        deb=$(ls "$LAB"/deb/srp-ublk_*.deb)
        mkdir -p "$STAGE/usr/lib/systemd/system/multi-user.target.wants"
        install -m 644 "$HERE/guest/lab-job.service" "$STAGE/usr/lib/systemd/system/"
        ln -s ../lab-job.service "$STAGE/usr/lib/systemd/system/multi-user.target.wants/lab-job.service"
        if [ "$LAB_SETUP" = early ]; then
            dpkg-deb -x "$deb" "$STAGE"
            # the port and the target at boot, and one target enabled as an administrator would
            mkdir -p "$STAGE/usr/lib/systemd/system/sysinit.target.wants"
            install -m 644 "$HERE/guest/lab-fabric.service" "$STAGE/usr/lib/systemd/system/"
            ln -s ../lab-fabric.service "$STAGE/usr/lib/systemd/system/sysinit.target.wants/"
            ln -s ../srp-ublk@.service "$STAGE/usr/lib/systemd/system/multi-user.target.wants/srp-ublk@boot.service"
        else
            install -m 644 "$deb" "$STAGE/usr/lib/srp-lab/srp-ublk.deb"
            # and as its RPM (packaging/rpm.sh), which test 71 installs and erases with rpm
            RPM_OUT=$LAB/rpm RPM_LINT=0 SRP_UBLK_BIN=$SRP_UBLK_BIN bash "$ROOT_DIR/packaging/rpm.sh" >/dev/null ||
                die "packaging $SRP_UBLK_BIN as an RPM failed (bash packaging/rpm.sh)"
            install -m 644 "$LAB"/rpm/srp-ublk-*.rpm "$STAGE/usr/lib/srp-lab/srp-ublk.rpm"
            install -m 644 "$HERE/guest/lab-install.service" "$STAGE/usr/lib/systemd/system/"
            ln -s ../lab-install.service "$STAGE/usr/lib/systemd/system/multi-user.target.wants/"
        fi
    else
        install -m 755 "$HERE/guest/init.sh" "$STAGE/init"
        install -m 755 "$SRP_UBLK_BIN" "$STAGE/usr/local/bin/srp-ublk"
        for lib in $(ldd "$SRP_UBLK_BIN" 2>/dev/null | grep -o '/[^ )]*'); do copy_file "$lib"; done
        # the hostile SRP target (examples/hostile_target.rs), when built: the suite's test for it
        # fails when it is missing
        if [ -x "$HOSTILE_BIN" ]; then
            install -m 755 "$HOSTILE_BIN" "$STAGE/usr/local/bin/hostile-target"
        fi
    fi
    pack "$out"
}

# ------------------------------------------------------------------------------------------ run
run_guest() {   # run_guest SCRIPT: boot a fresh guest, run SCRIPT in it, return its exit status
    local script=$1
    [ -f "$script" ] || die "no such script: $script"
    local RUN=$LAB/run OUT=$LAB/out root init=/init smp=$LAB_SMP mem=$LAB_MEM role=(-nic none) pfx=
    # a guest of a pair (run_pair): the target has run and output directories of its own; both get
    # the virtio-net link (the target guest listens on its socket, the initiator connects) and a
    # share they both mount (/lab-pair: the target guest's CPU counters for the bench)
    local server mac
    case ${LAB_ROLE:-} in
        target) RUN=$LAB/run-target; OUT=$LAB/out-target; smp=$LAB_TARGET_SMP; mem=$LAB_TARGET_MEM; pfx="target| "
                server=on; mac=02:00:00:77:00:01;;
        initiator) OUT=$LAB/out/pair; server=off; mac=02:00:00:77:00:02;;
    esac
    [ -n "${LAB_ROLE:-}" ] && role=(-netdev "stream,id=n0,server=$server,addr.type=unix,addr.path=$LAB/link.sock"
                                    -device "virtio-net-pci,netdev=n0,mac=$mac"
                                    -virtfs "local,path=$LAB/pair-share,mount_tag=pair,security_model=none,id=pair")
    case $LAB_BOOT in
        init) image; root=$BASE;;
        systemd) sysroot; root=$SYSROOT; OUT=$LAB/out/systemd; init=/sbin/init
                 [ "$LAB_SETUP" = early ] && OUT=$LAB/out/boot;;
        *) die "LAB_BOOT=$LAB_BOOT: want init or systemd";;
    esac
    [ "$LAB_KERNEL" = new ] && OUT=$OUT/kernel-new
    # LAB_QEMU_EXTRA is for the guest that runs the script, not for a pair's target guest
    local extra=${LAB_QEMU_EXTRA:-}
    [ "${LAB_ROLE:-}" = target ] && extra=
    rm -rf "$RUN"; mkdir -p "$RUN/share"
    rm -rf "$OUT"; mkdir -p "$OUT"
    overlay "$RUN/overlay.cpio.gz"
    cat "$root" "$RUN/overlay.cpio.gz" > "$RUN/initrd.gz"   # the kernel unpacks concatenated archives in order
    cp "$script" "$RUN/share/job.sh"
    [ "${LAB_ROLE:-}" = initiator ] && cp "$LAB/out-target/target-env" "$RUN/share/target-env"
    {
        echo "LAB_SETUP=$LAB_SETUP"; echo "SRP_LUN_MB=$SRP_LUN_MB"; echo "CI=${CI:-}"; echo "LAB_ROLE=${LAB_ROLE:-}"
        echo "LAB_JOB_NAME=$(basename "$script")"; echo "LAB_ONLY=${LAB_ONLY:-}"; echo "LAB_BOOT=$LAB_BOOT"
    } > "$RUN/share/env"
    local CON=$RUN/console.log
    : > "$CON"
    log "booting $KV ($LAB_BOOT${LAB_ROLE:+, $LAB_ROLE guest}, qemu TCG, $smp vCPUs, $mem, timeout ${LAB_TIMEOUT}s) to run $(basename "$script")"
    log "console log: $CON"
    local t0=$SECONDS
    timeout --foreground -k 10 "$LAB_TIMEOUT" qemu-system-x86_64 -accel tcg,thread=multi -cpu max \
        -smp "$smp" -m "$mem" -machine pc -nodefaults -no-reboot \
        -display none -monitor none -serial "file:$CON" "${role[@]}" \
        -kernel "$KDIR/boot/vmlinuz-$KV" -initrd "$RUN/initrd.gz" \
        -append "console=ttyS0,115200 rdinit=$init panic=-1 loglevel=3 mitigations=off quiet" \
        -virtfs "local,path=$RUN/share,mount_tag=lab,security_model=none,id=lab" \
        -virtfs "local,path=$OUT,mount_tag=labout,security_model=none,id=labout" \
        $extra > "$RUN/qemu.log" 2>&1 &
    local qpid=$! qrc=0
    # stream the guest console live (the job's output goes there too)
    tail -n +1 -F --pid=$qpid "$CON" 2>/dev/null | sed -u "s/\r\$//; s/^/$pfx/" &
    local tpid=$!
    wait $qpid || qrc=$?
    wait $tpid 2>/dev/null || true
    local dt=$((SECONDS - t0))
    if [ -f "$RUN/share/rc" ]; then
        local rc
        rc=$(cat "$RUN/share/rc")
        log "guest finished $(basename "$script") with exit status $rc after ${dt}s (qemu rc=$qrc)"
        return "$rc"
    fi
    if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
        log "error: the guest did not finish within LAB_TIMEOUT=${LAB_TIMEOUT}s and was killed; console log: $CON"
        return 124
    fi
    log "error: the guest stopped after ${dt}s without reporting an exit status (qemu rc=$qrc: $(tail -1 "$RUN/qemu.log" 2>/dev/null)); console log: $CON"
    return 125
}

# run_pair SCRIPT: two guests joined by a virtual Ethernet link (qemu's stream netdev over a unix
# socket), RoCE between them as a deployment has it: a target guest (LIO's ib_srpt, LAB_TARGET_SMP
# vCPUs) and an initiator guest (ublk_drv, ib_srp, srp-ublk; LAB_SMP vCPUs) that runs SCRIPT with
# the target's SRP_TARGET. The initiator's output is under target/lab/out/pair, the target's
# console and dmesg under target/lab/out-target. Exits with SCRIPT's status.
run_pair() {
    local script=$1 tpid rc=0 i=0
    [ -f "$script" ] || die "no such script: $script"
    [ "$LAB_BOOT" = init ] || die "lab.sh pair boots LAB_BOOT=init guests only"
    rm -f "$LAB/link.sock" "$LAB/out-target/target-env"
    rm -rf "$LAB/pair-share"; mkdir -p "$LAB/pair-share"   # both guests mount it (lab-pair)
    LAB_ROLE=target run_guest "$HERE/guest/target-job.sh" &
    tpid=$!
    # however this ends, the target guest powers off within a second of it
    trap 'touch "$LAB/run-target/share/stop" 2>/dev/null' EXIT
    while [ ! -s "$LAB/out-target/target-env" ]; do
        kill -0 $tpid 2>/dev/null || die "the target guest stopped before its target was ready (console: $LAB/run-target/console.log)"
        [ $i -lt 600 ] || { kill $tpid; die "the target guest's target was not ready within 600 s (console: $LAB/run-target/console.log)"; }
        sleep 1; i=$((i + 1))
    done
    log "target guest ready after ${i}s: $(grep SRP_TARGET= "$LAB/out-target/target-env")"
    LAB_ROLE=initiator run_guest "$script" || rc=$?
    touch "$LAB/run-target/share/stop"
    trap - EXIT
    wait $tpid || log "warning: the target guest ended with status $? (console: $LAB/run-target/console.log)"
    return $rc
}

selftest() {   # lab-run must propagate the script's exit status
    local tmp rc=0
    tmp=$(mktemp -d); printf '#!/bin/sh\necho "selftest: exiting 3 on purpose"\nexit 3\n' > "$tmp/exit3.sh"
    LAB_SETUP=minimal run_guest "$tmp/exit3.sh" || rc=$?
    rm -rf "$tmp"
    if [ "$rc" = 3 ]; then echo "lab selftest: 1 passed, 0 failed"; return 0; fi
    echo "lab selftest: a guest script exiting 3 made lab-run exit $rc"; echo "lab selftest: 0 passed, 1 failed"
    return 1
}

suite_wanted() {   # suite_wanted DIR: does DIR hold a test LAB_ONLY selects?
    local t p
    for t in "$1"/[0-9]*.sh; do
        [ -e "$t" ] || continue
        [ -z "${LAB_ONLY:-}" ] && return 0
        for p in ${LAB_ONLY//,/ }; do case $(basename "$t") in *"$p"*) return 0;; esac; done
    done
    return 1
}

lab_test() {   # the suite in each kind of guest that has a selected test; fails if either fails
    local rc=0 ran=0
    if suite_wanted "$HERE/suite"; then
        ran=1; LAB_BOOT=init run_guest "$HERE/suite/run.sh" || rc=1
    fi
    if suite_wanted "$HERE/suite/systemd"; then
        ran=1; LAB_BOOT=systemd run_guest "$HERE/suite/run.sh" || rc=1
    fi
    # a boot with the port and the target made early and a target enabled (tests/lab/suite/boot)
    if suite_wanted "$HERE/suite/boot"; then
        ran=1; LAB_BOOT=systemd LAB_SETUP=early run_guest "$HERE/suite/run.sh" || rc=1
    fi
    # initiator and target in two guests joined by a virtual link (tests/lab/suite/pair)
    if suite_wanted "$HERE/suite/pair"; then
        ran=1; run_pair "$HERE/suite/run.sh" || rc=1
    fi
    # the tests with more to show on the new kernel, once more there (a subshell: a kernel of its own)
    local only="" t p
    for t in ${NEW_KERNEL_TESTS//,/ }; do
        if [ -z "${LAB_ONLY:-}" ]; then only=$only,$t; continue; fi
        for p in ${LAB_ONLY//,/ }; do case $t in *"$p"*) only=$only,$t;; esac; done
    done
    if [ -n "$only" ]; then
        ran=1; (KPKG=; NEW_KURL=; LAB_KERNEL=new; LAB_ONLY=${only#,}; LAB_BOOT=init
                run_guest "$HERE/suite/run.sh") || rc=1
    fi
    [ $ran = 1 ] || die "LAB_ONLY=${LAB_ONLY:-} selects no test in tests/lab/suite, suite/systemd, suite/boot or suite/pair"
    return $rc
}

# One guest run at a time per lab directory: a second would wipe the first's run directory (its
# initrd and shared folder) under its running guest. The holder is named, not waited for.
lab_lock() {
    mkdir -p "$LAB"
    exec 9>>"$LAB/lock"
    flock -n 9 || die "another lab run is using $LAB ($(cat "$LAB/lock.owner" 2>/dev/null || echo 'holder unknown')): wait for it to end, or give this one a directory of its own with LAB_DIR="
    echo "pid $$, $(basename "$0") $*, since $(date '+%F %T')" > "$LAB/lock.owner"
}

cmd=${1:-}
case $cmd in run|pair|test|demo|selftest) lab_lock "$@";; esac
case $cmd in
    prep) prep; log "kernel $KPKG ($KV) ready under $LAB";;
    image) image; log "base initramfs: $BASE";;
    run) [ $# -ge 2 ] || die "usage: lab.sh run FILE"; run_guest "$2";;
    pair) [ $# -ge 2 ] || die "usage: lab.sh pair FILE"; run_pair "$2";;
    test) lab_test;;
    demo) run_guest "$HERE/demo.sh";;
    selftest) selftest;;
    *) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 2;;
esac
