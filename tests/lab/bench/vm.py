#!/usr/bin/env python3
"""`just bench vm`'s report: tests/lab/bench/vm-guest.sh's raw lines -> a table and a JSON file.

Usage: vm.py RAW.txt OUT.json

A run line: `run ROUND DISK RW QD cpu BUSY VCPU QEMU SRP  BUSY VCPU QEMU SRP fio TERSE`, the four
counters (jiffies) sampled at the run's start and end in the lab guest: the whole guest busy, the
inner QEMU's vCPU thread, QEMU's other threads, srp-ublk's processes. The host's cost of a guest
I/O is everything busy but the vCPU thread (QEMU's I/O work, srp-ublk, the kernel's block/SCSI/
ib_srp/ublk/rxe work, and the LIO target's, which is the same for every disk), per I/O fio did.
Ratios are taken within a round (paired), then the median over rounds with the rounds' spread.
"""
import json
import statistics
import sys

DISKS = ("vhost", "ublk", "ibsrp")
PEER = "ibsrp"


def parse(path):
    runs, vhost_line, hz = [], None, 100
    for line in open(path):
        f = line.split()
        if not f:
            continue
        if f[0] == "ticks":
            hz = int(f[1])
        elif f[0] == "vhost:":
            vhost_line = line.split("vhost: ", 1)[1].strip()
        elif f[0] == "run" and len(f) >= 16:
            r, disk, rw, qd = int(f[1]), f[2], f[3], int(f[4])
            b = [int(x) for x in f[6:10]]
            e = [int(x) for x in f[10:14]]
            terse = f[15].split(";")
            if len(terse) < 82 or terse[4] != "0":
                runs.append(dict(round=r, disk=disk, rw=rw, qd=qd, error=f[15][:200]))
                continue
            side = 8 if rw.endswith("read") else 49
            iops = float(terse[side - 1])
            secs = float(terse[side]) / 1000.0
            lat = float(terse[39 if side == 8 else 80])  # total latency, mean (µs)
            d = [e[i] - b[i] for i in range(4)]
            runs.append(dict(round=r, disk=disk, rw=rw, qd=qd, iops=iops, lat_us=lat,
                             ios=iops * secs, busy=d[0], vcpu=d[1], qemu=d[2], srp=d[3]))
    return runs, vhost_line, hz


def per_io_us(run, ticks, hz):
    return ticks * 1e6 / hz / run["ios"] if run["ios"] else float("nan")


def main():
    raw, out = sys.argv[1], sys.argv[2]
    runs, vhost_line, hz = parse(raw)
    bad = [r for r in runs if "error" in r]
    for r in bad:
        print(f"vm-bench: round {r['round']} {r['disk']} {r['rw']} QD{r['qd']}: fio failed: {r['error']}")
    good = [r for r in runs if "error" not in r]
    for r in good:
        r["host_us"] = per_io_us(r, r["busy"] - r["vcpu"], hz)
        r["qemu_us"] = per_io_us(r, r["qemu"], hz)
        r["srp_us"] = per_io_us(r, r["srp"], hz)
        r["kernel_us"] = r["host_us"] - r["qemu_us"] - r["srp_us"]
    cases = sorted({(r["rw"], r["qd"]) for r in good}, key=lambda c: (c[1], c[0]))
    table, result = [], {"raw": raw, "vhost_server": vhost_line, "cases": []}
    hdr = ("| case | disk | IOPS | lat µs | host CPU µs/IO (QEMU, srp-ublk, kernel+target) "
           "| IOPS vs ib_srp | lat vs ib_srp | host CPU vs ib_srp |")
    table += [hdr, "|" + "---|" * 8]
    for rw, qd in cases:
        by = {(r["disk"], r["round"]): r for r in good if r["rw"] == rw and r["qd"] == qd}
        rounds = sorted({k[1] for k in by})
        case = {"rw": rw, "qd": qd, "disks": {}}
        for disk in DISKS:
            mine = [by[(disk, n)] for n in rounds if (disk, n) in by]
            if not mine:
                continue
            med = {k: statistics.median(r[k] for r in mine)
                   for k in ("iops", "lat_us", "host_us", "qemu_us", "srp_us", "kernel_us")}
            ratios = {}
            for k in ("iops", "lat_us", "host_us"):
                per = [by[(disk, n)][k] / by[(PEER, n)][k] for n in rounds
                       if (disk, n) in by and (PEER, n) in by and by[(PEER, n)][k]]
                if per:
                    ratios[k] = dict(median=statistics.median(per), low=min(per), high=max(per),
                                     rounds=len(per))
            case["disks"][disk] = dict(median=med, vs_ibsrp=ratios, rounds=len(mine))

            def ratio(k):
                x = ratios.get(k)
                return f"{x['median']:.2f}x ({x['low']:.2f}-{x['high']:.2f})" if x and disk != PEER else "-"
            table.append(
                f"| {rw} 4k QD{qd} | {disk} | {med['iops']:.0f} | {med['lat_us']:.0f} | "
                f"{med['host_us']:.0f} ({med['qemu_us']:.0f}, {med['srp_us']:.0f}, {med['kernel_us']:.0f}) | "
                f"{ratio('iops')} | {ratio('lat_us')} | {ratio('host_us')} |")
        result["cases"].append(case)
    result["failed_runs"] = len(bad)
    print("\n".join(table))
    print()
    if any(r["kernel_us"] < 0 for r in good):
        # /proc/stat is sampled per tick, the threads' times are their measured runtimes: in an
        # emulated guest the two disagree, and the remainder can come out below zero
        print("note: the kernel+target column is what is left of the whole guest's busy time after "
              "the threads' own; below zero somewhere here, so the split is approximate (the host "
              "CPU column is the whole guest's busy time less the vCPU thread's)")
    print("bytes copied per I/O: vhost-user-blk from its server's count (below), /dev/ublkbN: every byte "
          "(ublk_drv copies between the request's pages and srp-ublk's buffer), ib_srp: none (FRWR)")
    if vhost_line:
        print(f"vhost-user-blk server: {vhost_line}")
    json.dump(result, open(out, "w"), indent=1)
    print(f"vm-bench: {len(good)} runs, {len(bad)} failed; {out}")
    return 1 if bad or not good else 0


if __name__ == "__main__":
    sys.exit(main())
