#!/usr/bin/env python3
"""The table of `just bench luns`: 8 LUNs of one target port, fio QD4 random 4 KiB 70/30 reads and
writes on each at once. Per initiator (srp_ublk: one daemon for the port; srp_ublk_baseline: an
older binary, BENCH_BASELINE; ib_srp: the kernel's): the median IOPS over rounds, the guest's CPU
time per I/O, the QPs it holds and the memory its daemons pinned; then srp_ublk against each other
initiator as per-round ratios (median and range), each ratio taken within one round.

usage: luns.py RAW_DIR OUT_JSON"""
import json
import os
import statistics
import sys

raw, out_json = sys.argv[1], sys.argv[2]
hz = os.sysconf("SC_CLK_TCK")
meta = {}
held = {}
for line in open(os.path.join(raw, "meta")):
    line = line.strip()
    if "=" not in line:
        continue
    if " " in line.split("=", 1)[0]:
        # "INI pids=... qps=N pinned_kib=N"
        ini, rest = line.split(" ", 1)
        held[ini] = dict(kv.split("=", 1) for kv in rest.split())
    else:
        k, v = line.split("=", 1)
        meta[k] = v

runs = {}
for f in sorted(os.listdir(raw)):
    if not f.endswith(".json"):
        continue
    ini, rnd = f[: -len(".json")].rsplit(".", 1)
    base = os.path.join(raw, f[: -len(".json")])
    with open(base + ".json") as fh:
        job = json.load(fh)["jobs"][0]
    ios = job["read"]["total_ios"] + job["write"]["total_ios"]
    c0b, _c0t, c1b, _c1t = (int(x) for x in open(base + ".cpu").read().split())
    runs.setdefault(ini, {})[rnd] = {
        "iops": job["read"]["iops"] + job["write"]["iops"],
        "guest_cpu_us_per_io": (c1b - c0b) / hz * 1e6 / max(ios, 1),
    }


def med(xs):
    return statistics.median(xs) if xs else float("nan")


summary = {"meta": meta, "initiators": {}, "ratios": {}}
print(f"bench luns: 8 LUNs x fio QD4 randrw 4k, {meta.get('rounds')} rounds x {meta.get('secs')} s, "
      f"{meta.get('queues')} queues, kernel {meta.get('kernel')}")
print(f"{'initiator':<20} {'IOPS':>9} {'CPU us/IO':>10} {'QPs':>4} {'pinned MiB':>11}")
for ini, rounds in runs.items():
    iops = med([r["iops"] for r in rounds.values()])
    cpu = med([r["guest_cpu_us_per_io"] for r in rounds.values()])
    h = held.get(ini, {})
    qps = int(h.get("qps", 0))
    pinned = int(h.get("pinned_kib", 0)) / 1024
    summary["initiators"][ini] = {"iops": iops, "guest_cpu_us_per_io": cpu, "qps": qps,
                                  "pinned_mib": pinned, "daemons": len(h.get("pids", "").split(","))
                                  if h.get("pids") else 0}
    print(f"{ini:<20} {iops:>9.0f} {cpu:>10.1f} {qps:>4} {pinned:>11.1f}")
mine = runs.get("srp_ublk", {})
for peer, rounds in runs.items():
    if peer == "srp_ublk":
        continue
    common = sorted(set(mine) & set(rounds))
    iops = [mine[r]["iops"] / rounds[r]["iops"] for r in common]
    cpu = [mine[r]["guest_cpu_us_per_io"] / rounds[r]["guest_cpu_us_per_io"] for r in common]
    summary["ratios"][peer] = {"iops": iops, "guest_cpu_per_io": cpu}
    print(f"srp_ublk / {peer}: IOPS {med(iops):.3f} (range {min(iops):.3f}-{max(iops):.3f}), "
          f"CPU per I/O {med(cpu):.3f} (range {min(cpu):.3f}-{max(cpu):.3f}), over {len(common)} rounds")
with open(out_json, "w") as fh:
    json.dump(summary, fh, indent=1)
