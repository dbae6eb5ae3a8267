//! `srp-ublk list`: devices, their targets, channels, credits and where each queue thread runs.

use clap::Args;
use srp_ublk::session::state::DeviceState;
use srp_ublk::session::timers::show_tmo;

/// `srp-ublk list ...`
#[derive(Debug, Args)]
pub struct ListArgs {
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// The CPUs a thread may run on, from /proc.
pub fn thread_cpus(pid: u32, tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Cpus_allowed_list:")
                    .map(|v| v.trim().to_string())
            })
        })
        .unwrap_or_else(|| "?".into())
}

/// Runs `list`.
pub fn run(a: ListArgs) -> anyhow::Result<()> {
    let devs = DeviceState::all();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&json(&devs))?);
        return Ok(());
    }
    if devs.is_empty() {
        println!("no srp-ublk devices");
        return Ok(());
    }
    for d in &devs {
        print_device(d);
    }
    println!("{}", host_total(&devs));
    Ok(())
}

/// The line that sums what the host's srp-ublk devices hold: devices, channels (one per queue)
/// and the memory their daemons pinned (each daemon counted once).
pub fn host_total(devs: &[DeviceState]) -> String {
    let channels: usize = devs.iter().map(|d| d.queues.len()).sum();
    let mut daemons: Vec<(u32, u64)> = devs
        .iter()
        .filter_map(|d| d.memory.as_ref().map(|m| (d.pid, m.pinned_bytes)))
        .collect();
    daemons.sort_unstable();
    daemons.dedup_by_key(|(pid, _)| *pid);
    let pinned: u64 = daemons.iter().map(|(_, b)| b).sum();
    format!(
        "total {} device(s), {channels} channel(s), {:.1} MiB pinned",
        devs.len(),
        pinned as f64 / (1u64 << 20) as f64
    )
}

/// `list --json`: each device's state file, with whether its daemon runs and each queue thread's
/// CPUs.
fn json(devs: &[DeviceState]) -> Vec<serde_json::Value> {
    devs.iter()
        .map(|d| {
            let mut j = serde_json::to_value(d).unwrap_or_default();
            j["state"] = if super::daemon::alive(d) {
                "running"
            } else {
                "daemon gone"
            }
            .into();
            if let Some(qs) = j["queues"].as_array_mut() {
                for q in qs {
                    let tid = q["tid"].as_i64().unwrap_or(0) as i32;
                    q["cpus"] = thread_cpus(d.pid, tid).into();
                }
            }
            j
        })
        .collect()
}

/// One device's lines of `list`.
fn print_device(d: &DeviceState) {
    println!(
        "{}  {} {}  {} MiB{}  lun {}  {} queue(s) x depth {}  poll {}  {}  pid {}",
        d.bdev,
        d.vendor,
        d.product,
        d.size >> 20,
        if d.read_only { " read-only" } else { "" },
        d.lun,
        d.queues.len(),
        d.depth,
        d.poll,
        super::daemon::describe(d),
        d.pid
    );
    println!("    target {}", d.target);
    println!(
        "    daemon version {}",
        d.version
            .as_deref()
            .unwrap_or("not recorded (a daemon older than this field)")
    );
    if let Some(u) = &d.unit {
        println!("    unit {u}");
    }
    match d.log.as_str() {
        "" => {}
        // journald files a daemon's lines under the unit whose stderr it inherited, with the
        // unit's other processes' lines; each of the daemon's starts with the device's name
        super::spawn::JOURNAL_LOG => println!(
            "    log the journal: journalctl{} -g '^ublkb{}: '",
            d.unit
                .as_deref()
                .map_or(String::new(), |u| format!(" -u {u}")),
            d.dev_id
        ),
        path => println!("    log {path}"),
    }
    if let Some(o) = &d.owner {
        println!("    attached by {o} (srp-ublk up)");
    }
    if let Some(w) = &d.wwid {
        println!("    wwid {w}");
    }
    if d.size_pending > 0 {
        println!(
            "    capacity now {} MiB on the target: this kernel's ublk cannot resize a live \
             device; del and add it again",
            d.size_pending >> 20
        );
    }
    if let Some(t) = &d.timers {
        println!(
            "    timers reconnect_delay {} fast_io_fail_tmo {} dev_loss_tmo {}",
            show_tmo(t.reconnect_delay),
            show_tmo(t.fast_io_fail_tmo),
            show_tmo(t.dev_loss_tmo)
        );
    }
    if let Some(m) = &d.memory {
        println!(
            "    memory {} protection domain(s), {} data registration(s), {} KiB pinned",
            m.domains,
            m.registrations,
            m.pinned_bytes >> 10
        );
    }
    for q in &d.queues {
        println!(
            "    q{} channel {} via {}: tid {} cpus {} credits {} (login {}) cmds {} credit stalls {} reconnects {}",
            q.qid,
            q.state,
            d.rdma_device,
            q.tid,
            thread_cpus(d.pid, q.tid),
            q.req_lim,
            q.req_lim_login,
            q.cmds,
            q.credit_stalls,
            q.reconnects
        );
    }
}
