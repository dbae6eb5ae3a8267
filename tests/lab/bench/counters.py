#!/usr/bin/env python3
"""The table of `just bench counters`: per case and srp-ublk variant (srp_ublk: the default
rkey_scope=command; srp_ublk_login: rkey_scope=login), the median over rounds of its and ib_srp's
IOPS, the per-round ratio srp-ublk / ib_srp (median and range), and per I/O: srp-ublk's daemon system
calls, context switches and CPU time, and the whole guest's CPU time for each initiator.

usage: counters.py RAW_DIR OUT_JSON"""
import json
import os
import statistics
import sys

raw, out_json = sys.argv[1], sys.argv[2]
runs = {}
for f in sorted(os.listdir(raw)):
    if not f.endswith(".json"):
        continue
    case, ini, rnd = f[: -len(".json")].rsplit(".", 2)
    base = os.path.join(raw, f[: -len(".json")])
    with open(base + ".json") as fh:
        job = json.load(fh)["jobs"][0]
    ios = job["read"]["total_ios"] + job["write"]["total_ios"]
    iops = job["read"]["iops"] + job["write"]["iops"]
    c0b, c0t, c1b, c1t = (int(x) for x in open(base + ".cpu").read().split())
    hz = os.sysconf("SC_CLK_TCK")
    r = {"iops": iops, "ios": ios, "guest_cpu_us_per_io": (c1b - c0b) / hz * 1e6 / max(ios, 1)}
    if os.path.exists(base + ".perf"):
        for line in open(base + ".perf"):
            parts = line.strip().split(",")
            if len(parts) < 3 or not parts[0].replace(".", "").isdigit():
                continue
            v, ev = float(parts[0]), parts[2]
            if ev.startswith("raw_syscalls"):
                r["syscalls_per_io"] = v / max(ios, 1)
            elif ev == "context-switches":
                r["cs_per_io"] = v / max(ios, 1)
            elif ev == "task-clock":
                r["daemon_cpu_us_per_io"] = v * 1e3 / max(ios, 1)  # task-clock is in ms
    runs.setdefault(case, {}).setdefault(ini, {})[int(rnd)] = r

def med(xs):
    return statistics.median(xs) if xs else float("nan")

table = {}
print("| case | initiator | IOPS | ib_srp IOPS | ratio (median, range) | syscalls/IO | cs/IO | daemon CPU us/IO | guest CPU us/IO srp-ublk / ib_srp |")
print("|---|---|---|---|---|---|---|---|---|")
for case, by in runs.items():
    k = by.get("ib_srp", {})
    # srp_ublk: the default rkey_scope (command); srp_ublk_login: login-wide registrations
    for ini in sorted(i for i in by if i.startswith("srp_ublk")):
        s = by[ini]
        rounds = sorted(set(s) & set(k))
        ratios = [s[r]["iops"] / k[r]["iops"] for r in rounds if k[r]["iops"] > 0]
        m = lambda d, key: med([d[r][key] for r in d if key in d[r]])
        row = {
            "rounds": len(rounds),
            "srp_ublk_iops": m(s, "iops"),
            "ib_srp_iops": m(k, "iops"),
            "ratio_median": med(ratios),
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
            "syscalls_per_io": m(s, "syscalls_per_io"),
            "cs_per_io": m(s, "cs_per_io"),
            "daemon_cpu_us_per_io": m(s, "daemon_cpu_us_per_io"),
            "guest_cpu_us_per_io_srp_ublk": m(s, "guest_cpu_us_per_io"),
            "guest_cpu_us_per_io_ib_srp": m(k, "guest_cpu_us_per_io"),
        }
        table[case if ini == "srp_ublk" else f"{case} {ini}"] = row
        print(
            f"| {case} | {ini} | {row['srp_ublk_iops']:.0f} | {row['ib_srp_iops']:.0f} | "
            f"{row['ratio_median']:.2f} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f}) | "
            f"{row['syscalls_per_io']:.2f} | {row['cs_per_io']:.2f} | {row['daemon_cpu_us_per_io']:.1f} | "
            f"{row['guest_cpu_us_per_io_srp_ublk']:.0f} / {row['guest_cpu_us_per_io_ib_srp']:.0f} |"
        )
meta = dict(l.strip().split("=", 1) for l in open(os.path.join(raw, "meta")) if "=" in l)
with open(out_json, "w") as fh:
    json.dump({"meta": meta, "cases": table}, fh, indent=1)
