"""The whole-guest profile of `just bench counters` (perf cpu-clock on every vCPU, reported per
comm, DSO and symbol; since 2026-12-04 folded from call chains by `lab-prof fold`, which charges a
sample taken where interrupts came back on to the lock's holder): where each sample landed
(initiator, fabric, target, fio, scheduler, other, idle) and the guest's busy time per I/O of a
profiled run. Used by counters.py (the split per category), symbols.py (the split per task and
symbol) and irqoff.py."""
import json
import os
import re

PROF_LINE = re.compile(r"^\s*(?P<pct>[\d.]+)%\s+(?P<samples>\d+)\s+(?P<comm>\S+)\s+(?P<dso>\S+)\s+"
                       r"\[(?P<ring>.)\]\s+(?P<sym>\S+)")


# Where a sample of the whole-guest profile landed. Kernel modules by name; the core kernel's symbols
# by prefix (the network stack under rxe is the fabric, blk/bio the block layer both initiators use);
# what is left goes to the task it ran in: srp-ublk's threads -> initiator, fio -> fio.
MODULES = {
    "fabric": ("rdma_rxe", "ib_uverbs", "ib_core", "rdma_cm", "ib_cm", "iw_cm", "rdma_ucm", "udp_tunnel",
               "ip6_udp_tunnel", "virtio_net", "net_failover"),
    "target": ("ib_srpt", "target_core"),
    "initiator": ("ib_srp", "scsi_transport_srp", "scsi_mod", "sd_mod", "ublk_drv"),
}
SCHED = ("schedule", "__schedule", "finish_task_switch", "try_to_wake_up", "ttwu", "__wake_up", "wake_up",
         "enqueue_", "dequeue_", "pick_next", "update_curr", "update_load", "psi_", "select_task_rq",
         "__switch_to", "switch_mm", "context_switch", "raw_spin_rq", "sched_", "__sched")
FABRIC = ("net", "__net", "ip", "__ip", "udp", "__udp", "skb", "__skb", "dev_", "__dev", "netif", "__netif",
          "napi", "__napi", "loopback", "neigh", "eth_", "fib", "dst_", "nf_", "sock_", "sk_", "__sk", "csum",
          "crc32", "__crc32", "crc32c", "kfree_skb", "consume_skb", "validate_xmit", "rt_", "inet_")
BLOCK = ("blk_", "__blk", "bio_", "__bio", "submit_bio", "bvec", "sbitmap", "__sbitmap", "dd_", "mempool")
IDLE = ("idle", "safe_halt", "cpuidle", "mwait", "halt")
AIO = ("aio_", "__x64_sys_io_submit", "__x64_sys_io_getevents", "io_submit_one", "read_events",
       "do_io_getevents", "__do_sys_io")


def where(comm, dso, ring, sym):
    if comm.startswith("swapper") and any(w in sym for w in IDLE):
        return "idle"
    mod = dso.strip("[]")
    for cat, names in MODULES.items():
        if any(mod == n or mod.startswith(n) for n in names):
            return cat
    if ring == "k":
        if sym.startswith(SCHED):
            return "sched"
        if sym.startswith(FABRIC):
            return "fabric"
        if sym.startswith(BLOCK):
            return "initiator"
        if sym.startswith(AIO):
            return "fio"
        if sym.startswith(("io_", "__io_")):
            return "initiator"  # io_uring: only srp-ublk's daemon uses it here (fio runs libaio)
    # the ublk server's own threads: srp-ublk's daemon, or rublk's (the null peer)
    if comm.startswith(("srp-ublk", "srp_ublk", "rublk")):
        return "initiator"
    if comm == "fio":
        return "fio"
    # workqueue workers carry their queue's name, cut to 15 characters, after "-" (after "+" while
    # they run one of its items): rxe_wq; target_completion; ib_comp_wq, high priority ("H"), where
    # ib_srpt polls its CQs and LIO runs each command (ib_srp polls in softirq, srp-ublk in user space)
    if comm.startswith("kworker/"):
        head, wq = re.split(r"[-+]", comm, maxsplit=1) if re.search(r"[-+]", comm) else (comm, "")
        if wq and ("rxe".startswith(wq) or wq.startswith("rxe")):
            return "fabric"
        if wq and ("target".startswith(wq) or wq.startswith("tar")):
            return "target"
        if wq and head.endswith("H") and ("ib_comp_wq".startswith(wq) or wq.startswith("ib_comp")):
            return "target"
    return "other"


CATS = ("initiator", "fabric", "target", "fio", "sched", "other")


# Which guest's profile: the initiator guest's (the one that ran fio, "prof") or, with the target in a
# guest of its own (lab.sh pair), the target guest's over the same window ("tprof"); each with its
# /proc/stat over fio's run.
GUESTS = {"initiator": ("prof", "cpu"), "target": ("tprof", "tcpu")}


def module_map(raw, guest):
    """Each module symbol's module in that guest ({"rxe_rcv": "rdma_rxe"}), from its /proc/kallsyms
    (PROFILE.modules, written beside the profile since 2026-12-04; {} for older runs). The guest's
    perf reports module symbols under [kernel.kallsyms], so without it a module's work is placed by
    its symbol's prefix or the task it ran in."""
    path = os.path.join(raw, f"{GUESTS[guest][0]}.modules")
    if not os.path.exists(path):
        return {}
    return dict(line.split()[:2] for line in open(path) if len(line.split()) >= 2)


def samples(raw, case, ini, guest="initiator"):
    """(comm, dso, ring, sym, samples) of each line of a profiled run's report; a module symbol's
    DSO is its module ("[rdma_rxe]") where the run recorded the guest's modules."""
    mods = module_map(raw, guest)
    for line in open(os.path.join(raw, f"{case}.{ini}.{GUESTS[guest][0]}.samples")):
        m = PROF_LINE.match(line)
        if m:
            dso = m["dso"]
            if dso == "[kernel.kallsyms]" and m["sym"] in mods:
                dso = f"[{mods[m['sym']]}]"
            yield m["comm"], dso, m["ring"], m["sym"], int(m["samples"])


def busy_us_per_io(raw, case, ini, guest="initiator"):
    """A guest's busy CPU time per I/O of a profiled run (/proc/stat over fio's run)."""
    base = os.path.join(raw, f"{case}.{ini}.prof")
    job = json.load(open(base + ".json"))["jobs"][0]
    ios = job["read"]["total_ios"] + job["write"]["total_ios"]
    c0b, _, c1b, _ = (int(x) for x in open(f"{base}.{GUESTS[guest][1]}").read().split())
    return (c1b - c0b) / os.sysconf("SC_CLK_TCK") * 1e6 / max(ios, 1)


def profiled(raw, guest="initiator"):
    """(case, initiator) of every profiled run in `raw` (of that guest)."""
    end = f".{GUESTS[guest][0]}.samples"
    return [tuple(f[: -len(end)].rsplit(".", 1)) for f in sorted(os.listdir(raw))
            if f.endswith(end)]
