#!/usr/bin/env python3
"""One case of a `just bench counters` profile by task and symbol: the guest's busy time per I/O of
each profiled initiator, split in proportion to the samples of each (task, symbol), with tasks'
numbers folded (kworker/u4:2-rxe_wq -> kworker/uN:N-rxe_wq). Rows are sorted by how far the
initiators differ on them, so the symbols behind a category's gap come first.

usage: symbols.py RAW_DIR CASE [CATEGORY|all] [ROWS] [initiator|target]
  e.g. symbols.py target/bench/counters-20261204T003417Z randread-4k-qd32 initiator 30
The last argument picks the guest whose profile is read: the target guest's is there in a pair's
run (BENCH_PAIR=1)."""
import re
import sys

from guestprof import busy_us_per_io, profiled, samples, where

raw, case = sys.argv[1], sys.argv[2]
want = sys.argv[3] if len(sys.argv) > 3 else "all"
rows = int(sys.argv[4]) if len(sys.argv) > 4 else 40
guest = sys.argv[5] if len(sys.argv) > 5 else "initiator"

us = {}
for c, ini in profiled(raw, guest):
    if c != case:
        continue
    n, work = {}, 0
    for comm, dso, ring, sym, count in samples(raw, case, ini, guest):
        cat = where(comm, dso, ring, sym)
        if cat != "idle":
            work += count
        if want in ("all", cat):
            key = (re.sub(r"\d+", "N", comm), sym)
            n[key] = n.get(key, 0) + count
    busy = busy_us_per_io(raw, case, ini, guest)
    us[ini] = {k: busy * v / max(work, 1) for k, v in n.items()}
if not us:
    sys.exit(f"symbols.py: no profiled run of {case} in {raw} (run counters with BENCH_PROFILE=1)")

inis = sorted(us)
keys = set().union(*us.values())


def spread(k):
    vals = [us[i].get(k, 0.0) for i in inis]
    return max(vals) - min(vals)


print(f"{case}, {want}: the {guest} guest's CPU us per I/O by task and symbol\n")
print("| task | symbol | " + " | ".join(inis) + " |")
print("|---|---|" + "---|" * len(inis))
for k in sorted(keys, key=spread, reverse=True)[:rows]:
    print(f"| {k[0]} | {k[1]} | " + " | ".join(f"{us[i].get(k, 0.0):.1f}" for i in inis) + " |")
print("| total | | " + " | ".join(f"{sum(us[i].values()):.1f}" for i in inis) + " |")
