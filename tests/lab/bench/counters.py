#!/usr/bin/env python3
"""The table of `just bench counters`: per case and srp-ublk variant (srp_ublk: the default
rkey_scope=command; srp_ublk_login: rkey_scope=login; srp_ublk_null: the null backend, whose peer is
rublk's null target), the median over rounds of its and its peer's IOPS (ib_srp unless said), the
per-round ratio srp-ublk / peer (median and range), and per I/O: srp-ublk's daemon system calls,
context switches and CPU time, and the whole guest's CPU time for each; then the completion
latency's p50 and p99 against the peer, each a ratio taken within the round; with a baseline binary
(`BENCH_BASELINE`), the new binary against it round by round; with the target in a guest of its own
(`BENCH_PAIR=1`), how busy each guest was and the target guest's CPU per I/O; then the whole-guest
profile's split of that CPU time (initiator, fabric, target, fio, scheduler), of the target guest's
too in a pair; and perftest's 4 KiB message rate on the same device with each initiator's best 4 KiB
random read against it.

usage: counters.py RAW_DIR OUT_JSON"""
import glob
import json
import math
import os
import statistics
import sys

from guestprof import CATS, busy_us_per_io, profiled, samples, where
from report import fio_latency, perftest

raw, out_json = sys.argv[1], sys.argv[2]
runs = {}
lat_kinds = set()
for f in sorted(os.listdir(raw)):
    if not f.endswith(".json"):
        continue
    case, ini, rnd = f[: -len(".json")].rsplit(".", 2)
    if rnd == "prof":
        continue  # the profiled run: see profiles() below
    base = os.path.join(raw, f[: -len(".json")])
    with open(base + ".json") as fh:
        job = json.load(fh)["jobs"][0]
    ios = job["read"]["total_ios"] + job["write"]["total_ios"]
    iops = job["read"]["iops"] + job["write"]["iops"]
    c0b, c0t, c1b, c1t = (int(x) for x in open(base + ".cpu").read().split())
    hz = os.sysconf("SC_CLK_TCK")
    r = {"iops": iops, "ios": ios, "guest_cpu_us_per_io": (c1b - c0b) / hz * 1e6 / max(ios, 1),
         "guest_busy": (c1b - c0b) / max(c1t - c0t, 1)}
    if os.path.exists(base + ".tcpu"):
        # the target guest's /proc/stat over the same run (lab.sh pair): its CPU per I/O and how
        # busy it was, to tell a target-bound case from an initiator-bound one
        t0b, t0t, t1b, t1t = (int(x) for x in open(base + ".tcpu").read().split())
        r["target_cpu_us_per_io"] = (t1b - t0b) / hz * 1e6 / max(ios, 1)
        r["target_busy"] = (t1b - t0b) / max(t1t - t0t, 1)
    if os.path.exists(base + ".pkts"):
        # RoCE packets on the initiator guest's port over the run (sent + received)
        s0, r0, s1, r1 = (int(x) for x in open(base + ".pkts").read().split())
        r["pkts_per_io"] = (s1 - s0 + r1 - r0) / max(ios, 1)
    # latency of the direction that did the I/O (the cases are reads or writes)
    d = job["read"] if job["read"]["total_ios"] >= job["write"]["total_ios"] else job["write"]
    kind, pct = fio_latency(d)
    lat_kinds.add(kind)
    for key, name in (("50.000000", "p50_us"), ("99.000000", "p99_us")):
        if key in pct:
            r[name] = pct[key] / 1e3
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
    if os.path.exists(base + ".ctx"):
        # the daemon's threads' own count, fio's run only: a sleep or a yield that let another
        # task run (voluntary) against a preemption (involuntary)
        v0, n0, v1, n1 = (int(x) for x in open(base + ".ctx").read().split())
        r["vcs_per_io"] = (v1 - v0) / max(ios, 1)
        r["ivcs_per_io"] = (n1 - n0) / max(ios, 1)
    runs.setdefault(case, {}).setdefault(ini, {})[int(rnd)] = r


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def split(row):
    """The context switches' split, voluntary + involuntary, when the run counted it."""
    v, n = row["voluntary_cs_per_io"], row["involuntary_cs_per_io"]
    return "" if math.isnan(v) or math.isnan(n) else f" ({v:.2f} + {n:.2f})"


def paired(a, b, key):
    """Per round a / b of `key`, over the rounds both have it."""
    return [a[r][key] / b[r][key] for r in sorted(set(a) & set(b))
            if key in a[r] and b[r].get(key, 0) > 0]


def m(d, key):
    """The median over rounds of `key`, over the rounds that have it."""
    return med([d[r][key] for r in d if key in d[r]])


def rng(xs):
    """A ratio's median and range, or "-" without rounds."""
    return f"{med(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})" if xs else "-"


def print_profiles(raw, table, guest="initiator"):
    rows = []
    for case, ini in profiled(raw, guest):
        n = {}
        for comm, dso, ring, sym, count in samples(raw, case, ini, guest):
            cat = where(comm, dso, ring, sym)
            n[cat] = n.get(cat, 0) + count
        busy_us = busy_us_per_io(raw, case, ini, guest)
        work = sum(v for k, v in n.items() if k != "idle") or 1
        split = {c: busy_us * n.get(c, 0) / work for c in CATS}
        rows.append((case, ini, busy_us, split))
        key = case if ini == "srp_ublk" else f"{case} {ini}"
        name = "profile_us_per_io" if guest == "initiator" else "target_guest_profile_us_per_io"
        table.setdefault(key, {})[name] = {"guest": busy_us, **split}
    if not rows:
        return
    which = "the guest's" if guest == "initiator" else "the target guest's (lab.sh pair, the same window)"
    print(f"\nWhere {which} CPU goes, us per I/O (one profiled run per case: perf cpu-clock on every CPU,"
          " each sample by its module, symbol or task; busy time from /proc/stat):\n")
    print("| case | initiator | guest | " + " | ".join(CATS) + " |")
    print("|---|---|---|" + "---|" * len(CATS))
    for case, ini, busy, split in rows:
        print(f"| {case} | {ini} | {busy:.0f} | " + " | ".join(f"{split[c]:.0f}" for c in CATS) + " |")


def perftest_deltas(raw, kind):
    """Per perftest run, what a counter pair moved over the client's run: (first, second) from its
    `.KIND` file ("x0 y0 x1 y1": a guest's busy and total jiffies for cpu / tcpu, rxe's sent and
    received packets for pkts)."""
    out = []
    for f in sorted(glob.glob(os.path.join(raw, f"perftest.ib_write_bw.*.{kind}"))):
        x0, y0, x1, y1 = (int(x) for x in open(f).read().split())
        out.append((x1 - x0, y1 - y0))
    return out


def print_perftest(raw, runs, table, secs):
    """perftest's 4 KiB ib_write_bw message rate on the same device (the fabric's limit), each
    initiator's best 4 KiB random read against it, and each guest's CPU per message."""
    rate = perftest(raw).get("ib_write_bw")
    if not rate:
        return
    msgs = rate * secs
    nruns = len(glob.glob(os.path.join(raw, "perftest.ib_write_bw.*.txt")))
    cpu = {}
    for kind, name in (("cpu", "initiator guest"), ("tcpu", "target guest")):
        us = [busy / os.sysconf("SC_CLK_TCK") * 1e6 / msgs for busy, _ in perftest_deltas(raw, kind)]
        if us:
            cpu[name] = med(us)
    pkts = [(sent + rcvd) / msgs for sent, rcvd in perftest_deltas(raw, "pkts")]
    best = {}
    for case, by in runs.items():
        if case.startswith("randread-4k"):
            for ini, d in by.items():
                best[ini] = max(best.get(ini, 0), m(d, "iops"))
    table["perftest"] = {"ib_write_bw_msg_per_s": rate, "cpu_us_per_msg": cpu, "pkts_per_msg": med(pkts),
                         "best_randread_4k_vs_msg_rate": {i: v / rate for i, v in best.items()}}
    print(f"\nThe fabric's limit (perftest ib_write_bw, 4 KiB, median of {nruns} runs): {rate:.0f} msg/s; best 4 KiB"
          " random read against it: " + ", ".join(f"{i} {v / rate:.2f}" for i, v in sorted(best.items()))
          + (f"; {med(pkts):.2f} RoCE packets per message (sent + received)" if pkts else ""))
    if cpu:
        print("CPU per perftest message (each guest's busy time over the client's run, setup included; the"
              " client, in the initiator guest, polls its CQ without sleeping): "
              + ", ".join(f"{k} {v:.0f} us" for k, v in cpu.items()))


def peer(ini):
    """What a srp-ublk variant is measured against: rublk's null target for the null backend (the
    ublk front end alone), else the kernel's ib_srp on the same LUN."""
    return "rublk_null" if ini.startswith("srp_ublk_null") else "ib_srp"


table = {}
print("| case | initiator | IOPS | peer | peer IOPS | ratio (median, range) | syscalls/IO | cs/IO (voluntary + involuntary) | daemon CPU us/IO | guest CPU us/IO srp-ublk / peer |")
print("|---|---|---|---|---|---|---|---|---|---|")
for case, by in runs.items():
    # srp_ublk: the default rkey_scope (command); srp_ublk_login: login-wide registrations
    for ini in sorted(i for i in by if i.startswith("srp_ublk")):
        s = by[ini]
        k = by.get(peer(ini), {})
        rounds = sorted(set(s) & set(k))
        ratios = paired(s, k, "iops")
        row = {
            "rounds": len(rounds),
            "srp_ublk_iops": m(s, "iops"),
            "peer": peer(ini),
            "peer_iops": m(k, "iops"),
            "ratio_median": med(ratios),
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
            "syscalls_per_io": m(s, "syscalls_per_io"),
            "cs_per_io": m(s, "cs_per_io"),
            "voluntary_cs_per_io": m(s, "vcs_per_io"),
            "involuntary_cs_per_io": m(s, "ivcs_per_io"),
            "daemon_cpu_us_per_io": m(s, "daemon_cpu_us_per_io"),
            "guest_cpu_us_per_io_srp_ublk": m(s, "guest_cpu_us_per_io"),
            "guest_cpu_us_per_io_peer": m(k, "guest_cpu_us_per_io"),
        }
        table[case if ini == "srp_ublk" else f"{case} {ini}"] = row
        print(
            f"| {case} | {ini} | {row['srp_ublk_iops']:.0f} | {row['peer']} | {row['peer_iops']:.0f} | "
            f"{row['ratio_median']:.2f} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f}) | "
            f"{row['syscalls_per_io']:.2f} | {row['cs_per_io']:.2f}{split(row)} | {row['daemon_cpu_us_per_io']:.1f} | "
            f"{row['guest_cpu_us_per_io_srp_ublk']:.0f} / {row['guest_cpu_us_per_io_peer']:.0f} |"
        )
LATENCY = {"lat_ns": "total latency (lat: submission and completion)", "clat_ns": "completion latency (clat)"}
print(f"\nLatency (fio's {' and '.join(LATENCY[k] for k in sorted(lat_kinds))} percentiles of each run;"
      " the ratios are taken within each round):\n")
print("| case | initiator | p50 us | peer p50 us | p50 ratio (median, range) | p99 us | peer p99 us | p99 ratio (median, range) |")
print("|---|---|---|---|---|---|---|---|")
for case, by in runs.items():
    for ini in sorted(i for i in by if i.startswith("srp_ublk")):
        s, k = by[ini], by.get(peer(ini), {})
        row = table[case if ini == "srp_ublk" else f"{case} {ini}"]
        row["latency"] = "lat" if lat_kinds == {"lat_ns"} else "clat"
        cells = []
        for q in ("p50", "p99"):
            xs = paired(s, k, f"{q}_us")
            row[f"{q}_us"], row[f"peer_{q}_us"] = m(s, f"{q}_us"), m(k, f"{q}_us")
            row[f"{q}_ratio_median"] = med(xs)
            row[f"{q}_ratio_min"], row[f"{q}_ratio_max"] = (min(xs), max(xs)) if xs else (None, None)
            cells += [f"{row[f'{q}_us']:.0f}", f"{row[f'peer_{q}_us']:.0f}", rng(xs)]
        print(f"| {case} | {ini} | " + " | ".join(cells) + " |")
# lab.sh pair: both guests' busy share and the target guest's CPU per I/O, per initiator
pair = [(c, i) for c, by in runs.items() for i in sorted(by) if not math.isnan(m(by[i], "target_busy"))]
if pair:
    print("\nBoth guests (lab.sh pair; medians over rounds): how busy each was, and the target guest's CPU"
          " per I/O:\n")
    print("| case | initiator | IOPS | initiator guest busy | target guest busy | target guest CPU us/IO |")
    print("|---|---|---|---|---|---|")
    for case, ini in pair:
        d = runs[case][ini]
        key = case if ini == "srp_ublk" else f"{case} {ini}"
        table.setdefault(key, {})[f"guests_{ini}"] = {k: m(d, k) for k in
                                                      ("guest_busy", "target_busy", "target_cpu_us_per_io")}
        print(f"| {case} | {ini} | {m(d, 'iops'):.0f} | {m(d, 'guest_busy'):.0%} | {m(d, 'target_busy'):.0%} | "
              f"{m(d, 'target_cpu_us_per_io'):.0f} |")
# what each initiator put on the wire per I/O (rxe's port counters)
wire = [(c, i) for c, by in runs.items() for i in sorted(by) if not math.isnan(m(by[i], "pkts_per_io"))]
if wire:
    print("\nRoCE packets per I/O on the initiator guest's port (sent + received, medians over rounds; in one"
          " guest both ends' packets pass through it):\n")
    print("| case | " + " | ".join(sorted({i for _, i in wire})) + " |")
    print("|---|" + "---|" * len({i for _, i in wire}))
    for case in dict.fromkeys(c for c, _ in wire):
        cells = []
        for ini in sorted({i for _, i in wire}):
            v = m(runs[case].get(ini, {}), "pkts_per_io")
            cells.append("-" if math.isnan(v) else f"{v:.2f}")
            if not math.isnan(v):
                table.setdefault(case if ini == "srp_ublk" else f"{case} {ini}", {})[f"pkts_per_io_{ini}"] = v
        print(f"| {case} | " + " | ".join(cells) + " |")
# BENCH_BASELINE: the binary under test against the one before, round by round (the same boot, the
# same rounds, so a change smaller than the spread between boots still shows)
base = [c for c, by in runs.items() if "srp_ublk" in by and "srp_ublk_baseline" in by]
if base:
    print("\nThis binary against the baseline, round by round (new / old; for latency below 1 is better):\n")
    print("| case | IOPS new / old per round | median | ahead in | p50 new / old (median, range) | p99 new / old (median, range) |")
    print("|---|---|---|---|---|---|")
    for case in base:
        new, old = runs[case]["srp_ublk"], runs[case]["srp_ublk_baseline"]
        xs = paired(new, old, "iops")
        p50, p99 = paired(new, old, "p50_us"), paired(new, old, "p99_us")
        table[case]["baseline"] = {
            "iops_ratio_per_round": xs,
            "iops_ratio_median": med(xs),
            "p50_ratio_median": med(p50),
            "p99_ratio_median": med(p99),
        }
        print(f"| {case} | {' '.join(f'{x:.2f}' for x in xs)} | {med(xs):.2f} | "
              f"{sum(x > 1 for x in xs)} of {len(xs)} | {rng(p50)} | {rng(p99)} |")
meta = dict(l.strip().split("=", 1) for l in open(os.path.join(raw, "meta")) if "=" in l)
print_profiles(raw, table)
print_profiles(raw, table, "target")
print_perftest(raw, runs, table, int(meta["secs"]))
pins = [f"{k[len('pin_kb_per_queue_'):]} {int(v) / 1024:.1f} MiB" for k, v in sorted(meta.items())
        if k.startswith("pin_kb_per_queue_")]
if pins:
    print(f"\nPinned memory per queue (VmPin / queues): {', '.join(pins)}")
if "lab" in meta:
    print(f"\nLab: {meta['lab']}; the guest CPU figures are the initiator guest's")
with open(out_json, "w") as fh:
    json.dump({"meta": meta, "cases": table}, fh, indent=1)
