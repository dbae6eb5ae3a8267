#!/usr/bin/env python3
"""Turn the raw results of tests/lab/bench/guest.sh into a JSON summary and a markdown table.

usage: report.py RAW_DIR OUT_JSON COMMAND [LATEST_JSON PERFORMANCE_MD]

RAW_DIR holds CASE.INITIATOR.ROUND.json (fio), CASE.INITIATOR.ROUND.cpu ("busy0 total0 busy1 total1"
in jiffies of the whole guest), perftest.TOOL.ROUND.txt and meta. Raw figures are medians over
rounds, with spread = (max - min) / median. Ratios are srp-ublk / ib_srp taken within each round (the
two ran back to back), reported as the median of the rounds' ratios with their range: above 1 is
better for IOPS and MB/s, below 1 is better for latency and CPU per I/O. With LATEST_JSON and
PERFORMANCE_MD the summary is also written there and the table between the bench:lab markers of
PERFORMANCE_MD is replaced.
"""
import datetime
import glob
import json
import os
import re
import statistics
import sys

USER_HZ = 100  # /proc/stat jiffies


def load_meta(raw):
    meta = {}
    with open(os.path.join(raw, "meta")) as f:
        for line in f:
            k, _, v = line.strip().partition("=")
            meta[k] = v
    return meta


def fio_latency(side):
    """(kind, percentiles) of one direction of a fio job: its total latency (submission and
    completion) where the run asked for its percentiles (--lat_percentiles=1, since 2026-12-04),
    else the completion latency alone."""
    kind = "lat_ns" if "percentile" in side.get("lat_ns", {}) else "clat_ns"
    return kind, side.get(kind, {}).get("percentile", {})


def fio_run(path, cpu_path, secs):
    with open(path) as f:
        text = f.read()
    job = json.loads(text[text.index("{"):])["jobs"][0]
    side = job["read"] if job["read"]["total_ios"] > 0 else job["write"]
    kind, pct = fio_latency(side)
    run = {
        "latency": kind[: -len("_ns")],
        "iops": side["iops"],
        "mbps": side["bw"] * 1024 / 1e6,
        "p50_us": pct.get("50.000000", 0) / 1000,
        "p99_us": pct.get("99.000000", 0) / 1000,
    }
    with open(cpu_path) as f:
        b0, _t0, b1, _t1 = (int(x) for x in f.read().split())
    ios = side["iops"] * (secs + 1)  # fio's ramp second runs at about the same rate
    run["cpu_us_per_io"] = (b1 - b0) / USER_HZ * 1e6 / ios if ios else 0
    return run


def perftest(raw):
    """Median message rate (msg/s) of ib_write_bw/ib_read_bw and typical latency of ib_send_lat."""
    res = {}
    for tool in ("ib_write_bw", "ib_read_bw", "ib_send_lat"):
        vals = []
        for p in sorted(glob.glob(os.path.join(raw, f"perftest.{tool}.*.txt"))):
            with open(p) as f:
                rows = [l.split() for l in f if re.match(r"^\s*\d+\s+\d+\s+[\d.]", l)]
            if not rows:
                continue
            row = rows[-1]
            # bw: bytes iterations peak[MB/s] average[MB/s] msgrate[Mpps]; lat: ... t_typical is column 4
            vals.append(float(row[4]) * 1e6 if tool.endswith("_bw") else float(row[4]))
        if vals:
            res[tool] = statistics.median(vals)
    return res


def summarise(values):
    med = statistics.median(values)
    spread = (max(values) - min(values)) / med * 100 if med else 0
    return med, spread


def main():
    raw, out_json, command = sys.argv[1:4]
    meta = load_meta(raw)
    secs = int(meta.get("secs", 5))
    runs = {}  # (case, initiator) -> {round: run}
    for p in sorted(glob.glob(os.path.join(raw, "*.json"))):
        name = os.path.basename(p)[: -len(".json")]
        case, initiator, rnd = name.rsplit(".", 2)
        runs.setdefault((case, initiator), {})[int(rnd)] = fio_run(p, p[:-5] + ".cpu", secs)
    if not runs:
        sys.exit(f"report: no fio results under {raw}")

    def med(case, initiator, metric):
        vals = [r[metric] for r in runs.get((case, initiator), {}).values()]
        return summarise(vals) if vals else (None, None)

    def paired(case, initiator, metric):
        """Median and range of initiator / ib_srp over the rounds both ran (None if none)."""
        a, b = runs.get((case, initiator), {}), runs.get((case, "ib_srp"), {})
        ratios = [a[r][metric] / b[r][metric] for r in sorted(a) if r in b and b[r][metric]]
        if not ratios:
            return None, None
        return round(statistics.median(ratios), 3), [round(min(ratios), 3), round(max(ratios), 3)]

    cases = []
    order = ["randread-4k-qd32", "randread-4k-qd32x2", "randwrite-4k-qd32", "randwrite-4k-qd32x2",
             "randread-4k-qd1", "randwrite-4k-qd1", "read-128k-seq", "write-128k-seq"]
    for case in order:
        if (case, "srp_ublk") not in runs:
            continue
        metrics = [("iops", "IOPS")] if "qd32" in case else []
        if "qd1" in case:
            metrics = [("p50_us", "us"), ("p99_us", "us"), ("iops", "IOPS")]
        if "128k" in case:
            metrics = [("mbps", "MB/s")]
        metrics.append(("cpu_us_per_io", "CPU us/IO"))
        for metric, unit in metrics:
            s, s_spread = med(case, "srp_ublk", metric)
            k, k_spread = med(case, "ib_srp", metric)
            lg, lg_spread = med(case, "srp_ublk_login", metric)
            suffix = {"p50_us": "-p50", "p99_us": "-p99", "cpu_us_per_io": "-cpu"}.get(metric, "")
            if "qd1" in case and metric == "iops":
                suffix = "-iops"
            ratio, ratio_range = paired(case, "srp_ublk", metric)
            login_ratio, login_range = paired(case, "srp_ublk_login", metric)
            cases.append({
                "name": case + suffix, "unit": unit,
                "srp_ublk": round(s, 2), "ib_srp": round(k, 2) if k else None,
                "ratio": ratio, "ratio_range": ratio_range,
                "rounds": len(runs[(case, "srp_ublk")]),
                "srp_ublk_login": round(lg, 2) if lg else None,
                "login_ratio": login_ratio, "login_ratio_range": login_range,
                "spread_pct": {"srp_ublk": round(s_spread, 1), "ib_srp": round(k_spread or 0, 1),
                               "srp_ublk_login": round(lg_spread or 0, 1)},
            })
    pt = perftest(raw)
    if "ib_write_bw" in pt:
        best = max((c for c in cases if c["name"] in ("randread-4k-qd32", "randread-4k-qd32x2")),
                   key=lambda c: c["srp_ublk"])
        cases.append({
            "name": "perftest-4k-msg-rate", "unit": "IOPS vs msg/s",
            "srp_ublk": best["srp_ublk"], "ib_srp": best["ib_srp"], "perftest": round(pt["ib_write_bw"]),
            "ratio": round(best["srp_ublk"] / pt["ib_write_bw"], 3),
            "ib_srp_ratio": round(best["ib_srp"] / pt["ib_write_bw"], 3) if best["ib_srp"] else None,
            "note": f"best 4k randread ({best['name']}) against ib_write_bw's 4 KiB message rate "
                    "(a read's data is the target's RDMA WRITE)",
        })
    modes = []
    for m in ("adaptive", "interrupt", "busy"):
        ini = "mode-" + m
        if ("randread-4k-qd1", ini) not in runs:
            continue
        row = {"mode": m}
        for case, metric, key in (("randread-4k-qd1", "p50_us", "qd1_p50_us"),
                                  ("randread-4k-qd1", "cpu_us_per_io", "qd1_cpu_us_per_io"),
                                  ("randread-4k-qd32", "iops", "qd32_iops"),
                                  ("randread-4k-qd32", "cpu_us_per_io", "qd32_cpu_us_per_io")):
            v, sp = med(case, ini, metric)
            row[key] = round(v, 2)
            row[key + "_spread_pct"] = round(sp, 1)
        modes.append(row)
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kernel": meta.get("kernel"), "command": command,
        "setup": {k: meta.get(k) for k in ("rounds", "secs", "queues", "depth", "vcpus", "poll",
                                            "pin_kb_per_queue", "max_io_kb", "mode_rounds")},
        "cases": cases, "perftest": {k: round(v, 2) for k, v in pt.items()}, "poll_modes": modes,
        # what p50/p99 measure: "lat" (submission to completion) or "clat" (completion alone)
        "latency": "lat" if all(r["latency"] == "lat" for rs in runs.values() for r in rs.values())
        else "clat",
    }
    text = json.dumps(doc, indent=1) + "\n"
    with open(out_json, "w") as f:
        f.write(text)
    table = markdown(doc)
    print(table)
    if len(sys.argv) >= 6:
        with open(sys.argv[4], "w") as f:
            f.write(text)
        md_path = sys.argv[5]
        with open(md_path) as f:
            md = f.read()
        begin, end = "<!-- bench:lab:begin -->", "<!-- bench:lab:end -->"
        if begin in md and end in md:
            md = md[: md.index(begin) + len(begin)] + "\n" + table + md[md.index(end):]
            with open(md_path, "w") as f:
                f.write(md)
        else:
            print(f"report: {md_path} has no {begin} ... {end} markers; table not written", file=sys.stderr)


def fmt(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"


def ratio_cell(ratio, rng):
    if ratio is None:
        return "-"
    return f"{ratio:.2f} ({rng[0]:.2f}-{rng[1]:.2f})" if rng else f"{ratio:.2f}"


def markdown(doc):
    s = doc["setup"]
    login = any(c.get("srp_ublk_login") for c in doc["cases"])
    lines = [
        f"Command: `{doc['command']}`, {doc['date']}, kernel {doc['kernel']} under qemu TCG "
        f"({s['vcpus']} vCPUs), LIO rd_mcp LUN over rxe0, one boot. srp-ublk `--queues {s['queues']} "
        f"--depth {s['depth']}` (poll {s['poll']}, rkey_scope=command) against ib_srp `ch_count={s['queues']},"
        f"queue_size={int(s['depth']) + 1}`; fio libaio direct, {s['secs']} s after 1 s ramp "
        + ("(latency: fio's total, submission to completion), " if doc.get("latency") == "lat"
           else "(latency: fio's completion latency), ") +
        f"{s['rounds']} paired rounds (srp-ublk first in odd rounds, ib_srp first in even ones). "
        "Raw figures: medians of the rounds (spread = (max - min) / median); srp-ublk / ib_srp: the "
        "median of the ratios taken within each round, with their range."
        + (" `login`: srp-ublk with rkey_scope=login (buffers registered for the whole login)."
           if login else ""),
        "",
    ]
    if login:
        lines += ["| case | unit | srp-ublk | ib_srp | srp-ublk / ib_srp | login | login / ib_srp | spread srp-ublk / ib_srp / login |",
                  "|---|---|---|---|---|---|---|---|"]
    else:
        lines += ["| case | unit | srp-ublk | ib_srp | srp-ublk / ib_srp (range) | spread srp-ublk / ib_srp |",
                  "|---|---|---|---|---|---|"]
    for c in doc["cases"]:
        if c["name"] == "perftest-4k-msg-rate":
            continue
        sp = c["spread_pct"]
        row = (f"| {c['name']} | {c['unit']} | {fmt(c['srp_ublk'])} | {fmt(c['ib_srp'])} | "
               f"{ratio_cell(c['ratio'], c.get('ratio_range'))} | ")
        if login:
            row += (f"{fmt(c.get('srp_ublk_login'))} | "
                    f"{ratio_cell(c.get('login_ratio'), c.get('login_ratio_range'))} | "
                    f"{sp['srp_ublk']:.0f}% / {sp['ib_srp']:.0f}% / {sp.get('srp_ublk_login', 0):.0f}% |")
        else:
            row += f"{sp['srp_ublk']:.0f}% / {sp['ib_srp']:.0f}% |"
        lines.append(row)
    if s.get("pin_kb_per_queue"):
        lines += ["", f"Pinned memory per queue (the daemon's VmPin over its queues, depth {s['depth']}, "
                  f"largest I/O {s.get('max_io_kb')} KiB): {int(s['pin_kb_per_queue']) / 1024:.1f} MiB."]
    pt = doc["perftest"]
    if pt:
        lines += ["", "The fabric's own limit on the same rxe device (perftest, 4 KiB messages, medians of 2):"
                  f" ib_write_bw {fmt(pt.get('ib_write_bw'))} msg/s, ib_read_bw {fmt(pt.get('ib_read_bw'))} msg/s,"
                  f" ib_send_lat typical {fmt(pt.get('ib_send_lat'))} us."]
        for c in doc["cases"]:
            if c["name"] == "perftest-4k-msg-rate":
                lines.append(f"Best 4 KiB randread against ib_write_bw's message rate: srp-ublk "
                             f"{c['ratio']:.2f}, ib_srp {fmt(c['ib_srp_ratio'])}.")
    if doc["poll_modes"]:
        lines += ["", f"srp-ublk's completion modes (same boot; each mode a fresh device; randread 4 KiB; "
                  f"medians of {s.get('mode_rounds') or s['rounds']} rounds):", "",
                  "| --poll | QD1 p50 us | QD1 CPU us/IO | QD32 IOPS | QD32 CPU us/IO |", "|---|---|---|---|---|"]
        for m in doc["poll_modes"]:
            lines.append(f"| {m['mode']} | {fmt(m['qd1_p50_us'])} | {fmt(m['qd1_cpu_us_per_io'])} | "
                         f"{fmt(m['qd32_iops'])} | {fmt(m['qd32_cpu_us_per_io'])} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
