#!/usr/bin/env python3
"""Whether two `just bench` runs agree: for every case both have, each run's median srp-ublk / ib_srp
ratio must lie within the other run's range of per-round ratios (what issue 21 asks of a benchmark
that can be believed on a noisy machine).

usage: compare.py A.json B.json   (report.py's summaries: target/bench/lab-<time>.json)
Prints a markdown table; exits 1 when a case disagrees, 2 when the files have no case in common.
"""
import json
import sys


def cases(path):
    with open(path) as f:
        doc = json.load(f)
    return doc, {c["name"]: c for c in doc["cases"] if c.get("ratio_range")}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    (da, a), (db, b) = cases(sys.argv[1]), cases(sys.argv[2])
    names = [n for n in a if n in b]
    if not names:
        print(f"compare: no case with per-round ratios in both {sys.argv[1]} and {sys.argv[2]} "
              "(summaries from before paired rounds have none: rerun `just bench`)", file=sys.stderr)
        sys.exit(2)
    print(f"Run A: {da['date']} ({da['setup']['rounds']} rounds of {da['setup']['secs']} s); "
          f"run B: {db['date']} ({db['setup']['rounds']} rounds of {db['setup']['secs']} s).")
    # summaries before 2026-12-04 have no "latency": their p50/p99 are fio's completion latency
    lat_a, lat_b = da.get("latency", "clat"), db.get("latency", "clat")
    if lat_a != lat_b:
        print(f"Latency differs: A's p50/p99 are fio's {lat_a}, B's its {lat_b} (lat: submission and "
              "completion; clat: completion alone); those rows compare different measures.")
    print()
    print("| case | A: ratio (range) | B: ratio (range) | each median within the other's range |")
    print("|---|---|---|---|")
    bad = []
    for n in names:
        ra, rb = a[n]["ratio"], b[n]["ratio"]
        (la, ha), (lb, hb) = a[n]["ratio_range"], b[n]["ratio_range"]
        ok = lb <= ra <= hb and la <= rb <= ha
        if not ok:
            bad.append(n)
        print(f"| {n} | {ra:.2f} ({la:.2f}-{ha:.2f}) | {rb:.2f} ({lb:.2f}-{hb:.2f}) | "
              f"{'yes' if ok else 'NO'} |")
    print()
    print(f"{len(names) - len(bad)} of {len(names)} cases agree"
          + (f"; disagreeing: {', '.join(bad)}" if bad else ""))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
