#!/usr/bin/env python3
"""How much of a `just bench counters` profile the split by task cannot place: the samples charged
where interrupts come back on (`_raw_spin_unlock_irq`, `_raw_spin_unlock_irqrestore`; a TCG guest
has no NMI, so a timer sample that falls due with interrupts off is taken there) and at the end of
softirq processing (`handle_softirqs`). Their time was spent with interrupts or bottom halves off
somewhere before, by whatever ran there: for ib_srp that includes its completions, which run in
rxe's work items and in softirq, not in a task of its own. Per profiled run, us per I/O: the
initiator and fabric columns of counters.py without those samples, the samples themselves by the
column they were in, and the initiator's and fabric's sum with everything.

Since 2026-12-04 the profile is recorded with call chains and `lab-prof fold` charges such a sample
to the unlock's caller, so a newer run shows next to nothing unplaced; this reads the runs before.

usage: irqoff.py RAW_DIR"""
import collections
import sys

from guestprof import busy_us_per_io, profiled, samples, where

UNPLACED = ("_raw_spin_unlock_irq", "handle_softirqs")

raw = sys.argv[1]
print("| case | initiator | guest | initiator | fabric | unplaced in initiator | unplaced in fabric |"
      " unplaced elsewhere | initiator + fabric, all |")
print("|---|---|---|---|---|---|---|---|---|")
for case, ini in profiled(raw):
    n, work = collections.Counter(), 0
    for comm, dso, ring, sym, count in samples(raw, case, ini):
        cat = where(comm, dso, ring, sym)
        if cat == "idle":
            continue
        work += count
        n[("unplaced", cat) if sym.startswith(UNPLACED) else ("placed", cat)] += count
    us = busy_us_per_io(raw, case, ini) / max(work, 1)
    up = {c: n[("unplaced", c)] * us for c in ("initiator", "fabric")}
    elsewhere = sum(v for (k, c), v in n.items() if k == "unplaced" and c not in up) * us
    ini_us, fab_us = n[("placed", "initiator")] * us, n[("placed", "fabric")] * us
    print(f"| {case} | {ini} | {busy_us_per_io(raw, case, ini):.0f} | {ini_us:.0f} | {fab_us:.0f} | "
          f"{up['initiator']:.0f} | {up['fabric']:.0f} | {elsewhere:.0f} | "
          f"{ini_us + fab_us + up['initiator'] + up['fabric']:.0f} |")
