#!/usr/bin/env python3
"""After tests/lab/examples/sched-qd1.sh: for each task woken during the QD1 runs, how long it
waited for its CPU after the wake-up, and which task held that CPU meanwhile (per I/O, summed by
kind of task); then the daemon's own switches, voluntary (it slept) and involuntary (it yielded or
was preempted), by the task that ran next.

usage: sched-wait.py OUT_DIR   (target/lab/out)"""
import collections
import re
import sys

out = sys.argv[1]
daemon = {l.split()[0] for l in open(f"{out}/sched-tasks.txt") if len(l.split()) > 1}
ios = {l.split()[0]: float(l.split()[1]) for l in open(f"{out}/sched-ios.txt") if len(l.split()) > 1}
LINE = re.compile(r"^\s*(?P<comm>.+?)\s+(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<t>[\d.]+):\s+"
                  r"(?P<ev>\S+):\s+(?P<rest>.*)$")


def kind(pid, comm):
    if pid in daemon:
        return "srp-ublk"
    if pid == "0":
        return "idle"
    if comm.startswith("kworker/u"):
        return "kworker unbound (rxe_wq)"
    if comm.startswith("kworker/") and comm.endswith("H"):
        return "kworker highpri (ib-comp-wq)"
    if comm.startswith("kworker/"):
        return "kworker per-cpu"
    return comm


for rw, nio in ios.items():
    cur, woken, names = {}, {}, {}
    wait, n = collections.Counter(), collections.Counter()
    switched = collections.Counter()
    for line in open(f"{out}/sched-{rw}.txt"):
        m = LINE.match(line)
        if not m:
            continue
        t, cpu = float(m["t"]), int(m["cpu"])
        d = dict(kv.split("=", 1) for kv in re.findall(r"(\w+=\S+)", m["rest"]))
        if m["ev"].endswith("sched_wakeup"):
            names[d["pid"]] = d["comm"]
            woken[d["pid"]] = (t, int(d["target_cpu"]), cur.get(int(d["target_cpu"])))
        elif m["ev"].endswith("sched_switch"):
            prev, nxt = d["prev_pid"], d["next_pid"]
            names[prev], names[nxt] = d["prev_comm"], d["next_comm"]
            cur[cpu] = nxt
            if prev in daemon:
                how = "involuntary" if d["prev_state"].startswith("R") else "voluntary"
                switched[(how, kind(nxt, d["next_comm"]))] += 1
            if nxt in woken:
                t0, tc, holder = woken.pop(nxt)
                if tc == cpu and holder is not None:
                    k = (kind(nxt, names[nxt]), kind(holder, names.get(holder, "")))
                    wait[k] += (t - t0) * 1e6
                    n[k] += 1
    print(f"{rw} ({nio:.0f} I/Os): woken tasks' wait for their CPU, {sum(wait.values()) / nio:.0f} us per I/O")
    print("| woken | CPU held by | us per I/O | waits per I/O | mean wait us |\n|---|---|---|---|---|")
    for k, v in sorted(wait.items(), key=lambda kv: -kv[1])[:10]:
        print(f"| {k[0]} | {k[1]} | {v / nio:.1f} | {n[k] / nio:.2f} | {v / n[k]:.0f} |")
    print(f"\n{rw}: the daemon's switches per I/O, by the task that ran next")
    print("| switch | next | per I/O |\n|---|---|---|")
    for (how, nxt), c in sorted(switched.items(), key=lambda kv: -kv[1])[:8]:
        print(f"| {how} | {nxt} | {c / nio:.2f} |")
    print()
