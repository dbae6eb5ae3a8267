# srp-ublk tasks. `just test` is what CI runs (.ci/run); `just demo` is the main job.
set shell := ["bash", "-euo", "pipefail", "-c"]

lab := "tests/lab/lab.sh"

# list the recipes
default:
    @just --list

# install what building needs when missing: libclang (bindgen), the rdma-core headers, pkg-config
build-deps:
    #!/usr/bin/env bash
    set -euo pipefail
    missing=()
    for p in libclang-dev libibverbs-dev librdmacm-dev pkg-config; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if (( ${#missing[@]} )); then
        echo "installing build dependencies: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi

# build-deps, and the host tests' peers when missing (the NBD clients, fio, nbdkit, ...)
deps: build-deps
    #!/usr/bin/env bash
    set -euo pipefail
    missing=()
    for p in libnbd-bin qemu-utils fio systemd util-linux openssl python3-prometheus-client nbdkit; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if (( ${#missing[@]} )); then
        echo "installing test dependencies: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi

# the release binary alone (what install and the packages take)
release: build-deps
    cargo build --release --locked

# release build of the srp-ublk binary and the hostile SRP target (what the lab puts in the guest)
build: deps release
    cargo build --release --locked --features lab-target --example hostile_target

# formatting, clippy, unit tests, fuzz smoke, the lab selftest and the lab's end-to-end suite
test: deps fmt-check clippy unit deb rpm fuzz-smoke lab-selftest vm-test vm-test-lab lab-test

# cargo fmt --check
fmt-check:
    cargo fmt --all -- --check

# clippy on every target, warnings are errors
clippy: deps
    cargo clippy --locked --all-targets -- -D warnings
    cargo clippy --locked --all-targets --features lab-target,test-utils -- -D warnings

# unit, property and host integration tests
unit: deps
    cargo test --locked

# boot the lab and run FILE (a shell script) in the guest; exits with the script's status
lab-run FILE: build
    bash {{lab}} run "$(cd '{{invocation_directory()}}' && realpath '{{FILE}}')"

# FILE in an initiator guest whose SRP target (LIO) is in a second guest, RoCE over a virtual link
lab-pair FILE: build
    bash {{lab}} pair "$(cd '{{invocation_directory()}}' && realpath '{{FILE}}')"

# the end-to-end suite in the lab; prints "N passed, N failed" (LAB_ONLY=name runs a subset)
lab-test: build
    bash {{lab}} test

# a QEMU guest with srp-ublk's NBD export as its virtio-blk disk (docs/vm-hosts.md's options) and a
# vhost-user-blk disk over the fake target (QEMU's defaults), both read back
vm-test: build
    cargo build --locked --example vhost_fake --features test-utils
    bash tests/lab/vm/run.sh

# a VM inside the lab guest (QEMU under QEMU, both TCG: ~6 min) with two disks: LUN 0 through
# `serve --vhost-user-blk` (fio verify, a memory hot-plug) and LUN 1 on /dev/ublkbN
vm-test-lab: build
    bash tests/lab/vm/nested.sh

# proves lab-run propagates a guest script's exit status
lab-selftest: build
    bash {{lab}} selftest

# download/unpack the kernel and build the cached base initramfs
lab-image:
    bash {{lab}} image

# the main job: boot the lab, srp-ublk attaches the SRP LUN as /dev/ublkb0, fio verifies it
demo: build
    bash {{lab}} demo

# run each fuzz target for SECS seconds (cargo-fuzz, nightly)
fuzz SECS="60": fuzz-setup
    for t in $(cargo +nightly fuzz list); do cargo +nightly fuzz run "$t" -- -max_total_time={{SECS}} -rss_limit_mb=2048; done

# a short run of every fuzz target over its committed corpus (what CI runs; unoptimised, which
# builds in two thirds of the time and still replays the corpus and fuzzes for 5 s)
fuzz-smoke: fuzz-setup
    for t in $(cargo +nightly fuzz list); do cargo +nightly fuzz run --dev "$t" -- -max_total_time=5 -rss_limit_mb=2048; done

# install cargo-fuzz when missing
fuzz-setup: deps
    @command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

# benchmarks: `just bench` (= `just bench lab`: srp-ublk against the kernel's ib_srp in one lab boot, paired
# rounds with the ratio taken per round, with perftest's fabric limit and the poll modes; writes
# docs/bench/latest.json and the docs/performance.md table; tests/lab/bench/compare.py checks two runs agree),
# `just bench counters` (paired rounds srp-ublk / ib_srp with system calls, context switches and CPU per I/O,
# srp-ublk's null backend against rublk's null target, pinned memory per queue and a whole-guest profile
# split by initiator, fabric and target; knobs in tests/lab/bench/counters.sh; BENCH_PAIR=1 puts the target
# in a guest of its own),
# `just bench luns` (8 LUNs of one target port, fio QD4 on each at once: srp-ublk's port daemon
# against ib_srp and, with BENCH_BASELINE, an older binary; IOPS, CPU per I/O, QPs, pinned memory;
# tests/lab/bench/luns.sh),
# `just bench nbd` (NBD front end vs nbdkit and qemu-nbd on the host), `just bench hotpath` (the channel
# engine's instructions per 4 KiB read under callgrind, and ns per I/O), `just bench vm` (one VM in the lab
# with the LUN as vhost-user-blk, as virtio-blk on /dev/ublkbN and on ib_srp's disk: the same fio job on
# each in paired rounds, the guest's IOPS and latency and the host's CPU per guest I/O; BENCH_ROUNDS (3),
# BENCH_SECS (10); tests/lab/bench/vm.py)
bench WHAT="lab": build
    #!/usr/bin/env bash
    set -euo pipefail
    case "{{WHAT}}" in
        lab) bash tests/lab/bench/run.sh;;
        counters) bash tests/lab/bench/run.sh counters;;
        luns) bash tests/lab/bench/run.sh luns;;
        nbd) bash benches/nbd.sh;;
        hotpath)
            cargo build --release --locked --example hotpath
            command -v valgrind >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind; }
            ir() { valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/hotpath "$1" 2>&1 | sed -n 's/.*Collected : //p'; }
            a=$(ir 100000); b=$(ir 200000)
            echo "instructions per 4 KiB read (initiator side): $(( (b - a) / 100000 ))  [callgrind, (200k - 100k I/Os) / 100k]"
            target/release/examples/hotpath 2000000;;
        vm) NESTED_MODE=bench bash tests/lab/vm/nested.sh;;
        *) echo "just bench: unknown benchmark '{{WHAT}}' (have: lab, counters, luns, nbd, hotpath, vm)" >&2; exit 2;;
    esac

# criterion benchmarks of the wire codecs
bench-wire: deps
    cargo bench --bench wire

# The binary goes to /usr/sbin, where the units and udev rules look for it. Afterwards:
# systemctl daemon-reload && udevadm control --reload

# install the binary, systemd units, udev rules, man pages, completions and docs as the package does (root; DESTDIR= to stage)
install: release
    bash packaging/install.sh target/release/srp-ublk "${DESTDIR:-}"

# the Debian package, target/deb/srp-ublk_VERSION_ARCH.deb, checked by lintian (packaging/deb.sh)
deb: release
    bash packaging/deb.sh

# the RPM for RHEL-family hosts, target/rpm/srp-ublk-VERSION-1.ARCH.rpm, checked by rpmlint (packaging/rpm.sh)
rpm: release
    bash packaging/rpm.sh
