//! `srp-ublk list`: devices and exports, their targets, channels, credits and where each queue
//! thread runs.

use clap::Args;
use srp_ublk::session::exports::ExportState;
use srp_ublk::session::ids::port_path;
use srp_ublk::session::state::{DeviceState, QueueState};
use srp_ublk::session::timers::show_tmo;
use srp_ublk::wire::target::TargetSpec;

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
    let exports = ExportState::all();
    if a.json {
        let j = serde_json::json!({"devices": json(&devs), "exports": exports_json(&exports)});
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(());
    }
    if devs.is_empty() && exports.is_empty() {
        println!("no srp-ublk devices or exports");
        return Ok(());
    }
    for d in &devs {
        let shares = devs
            .iter()
            .any(|o| o.dev_id != d.dev_id && o.pid == d.pid && o.pid_start == d.pid_start);
        print_device(d, shares);
    }
    for e in &exports {
        print_export(e);
    }
    println!("{}", host_total(&devs, &exports));
    Ok(())
}

/// The line that sums what the host's srp-ublk devices and exports hold: devices, exports,
/// channels (one per queue) and the memory their processes pinned (each counted once).
pub fn host_total(devs: &[DeviceState], exports: &[ExportState]) -> String {
    // the devices of one target port's daemon share its channels
    let mut dev_channels: Vec<(u32, usize)> =
        devs.iter().map(|d| (d.pid, d.queues.len())).collect();
    dev_channels.sort_unstable();
    dev_channels.dedup_by_key(|(pid, _)| *pid);
    let channels: usize = dev_channels.iter().map(|(_, n)| n).sum::<usize>()
        + exports.iter().map(|e| e.queues.len()).sum::<usize>();
    let mut pinned: Vec<(u32, u64)> = devs
        .iter()
        .filter_map(|d| d.memory.as_ref().map(|m| (d.pid, m.pinned_bytes)))
        .chain(
            exports
                .iter()
                .filter(|e| e.alive())
                .filter_map(|e| e.memory.as_ref().map(|m| (e.pid, m.pinned_bytes))),
        )
        .collect();
    pinned.sort_unstable();
    pinned.dedup_by_key(|(pid, _)| *pid);
    let pinned: u64 = pinned.iter().map(|(_, b)| b).sum();
    format!(
        "total {} device(s), {} export(s), {channels} channel(s), {:.1} MiB pinned",
        devs.len(),
        exports.len(),
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
            add_cpus(&mut j, d.pid);
            j
        })
        .collect()
}

/// Each queue thread's CPUs, in a state file's JSON.
fn add_cpus(j: &mut serde_json::Value, pid: u32) {
    if let Some(qs) = j["queues"].as_array_mut() {
        for q in qs {
            let tid = q["tid"].as_i64().unwrap_or(0) as i32;
            q["cpus"] = thread_cpus(pid, tid).into();
        }
    }
}

/// `list --json`'s exports: each export's state file, with whether its server runs.
fn exports_json(exports: &[ExportState]) -> Vec<serde_json::Value> {
    exports
        .iter()
        .map(|e| {
            let mut j = serde_json::to_value(e).unwrap_or_default();
            j["state"] = if e.alive() { "running" } else { "server gone" }.into();
            add_cpus(&mut j, e.pid);
            j
        })
        .collect()
}

/// One export's lines of `list`.
fn print_export(e: &ExportState) {
    let running = if e.alive() {
        "running"
    } else {
        "SERVER GONE (stopped without removing its state file: its unit restarts it, or start \
         it again)"
    };
    println!(
        "export {}  {} {}  {} {}  {} MiB{}  lun {}  {} of {} connection(s), {} since start  {}  pid {}",
        e.name,
        e.kind,
        e.listen,
        e.vendor,
        e.product,
        e.size >> 20,
        if e.read_only { " read-only" } else { "" },
        e.lun,
        e.connections,
        e.max_connections,
        e.connections_total,
        running,
        e.pid
    );
    println!("    target {}", e.target);
    println!("    server version {}", e.version);
    if let Some(u) = &e.unit {
        println!("    unit {u}");
    }
    if let Some(w) = &e.wwid {
        println!("    wwid {w}");
    }
    if let Some(m) = &e.memory {
        print_memory(m);
    }
    for q in &e.queues {
        print_queue(e.pid, &e.rdma_device, q);
    }
}

fn print_memory(m: &srp_ublk::rdma::mem::MemCounts) {
    println!(
        "    memory {} protection domain(s), {} data registration(s), {} KiB pinned",
        m.domains,
        m.registrations,
        m.pinned_bytes >> 10
    );
}

/// A queue's line: its channel, its thread and its counters (an export's slot that no connection
/// has used yet has none).
fn print_queue(pid: u32, rdma_device: &str, q: &QueueState) {
    if q.state == "idle" {
        println!("    q{} channel {}: not used yet", q.qid, q.state);
        return;
    }
    let copies = if q.zero_copy_bytes + q.copied_bytes > 0 {
        format!(
            " zero copy {} MiB copied {} MiB",
            q.zero_copy_bytes >> 20,
            q.copied_bytes >> 20
        )
    } else {
        String::new()
    };
    // an export's channels log in as connections take them: no login figure is kept
    let login = match q.req_lim_login {
        0 => String::new(),
        n => format!(" (login {n})"),
    };
    println!(
        "    q{} channel {} via {}: tid {} cpus {} credits {}{login} cmds {} credit stalls {} \
         reconnects {}{copies}",
        q.qid,
        q.state,
        rdma_device,
        q.tid,
        thread_cpus(pid, q.tid),
        q.req_lim,
        q.cmds,
        q.credit_stalls,
        q.reconnects
    );
}

/// What the lines about device `d` start with, as a journalctl pattern: its name, and its port's
/// if its daemon serves the port's other devices too.
fn log_names(d: &DeviceState, shares: bool) -> String {
    let port = TargetSpec::parse(&d.target).ok().filter(|_| shares);
    match port {
        Some(t) => format!("(ublkb{}|port {})", d.dev_id, port_path(&t)),
        None => format!("ublkb{}", d.dev_id),
    }
}

/// One device's lines of `list`; `shares` its daemon with other devices (a target port's).
fn print_device(d: &DeviceState, shares: bool) {
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
        // unit's other processes' lines; each of the daemon's starts with the device's name (a
        // port daemon's lines not about one device, with the port's)
        super::spawn::JOURNAL_LOG => println!(
            "    log the journal: journalctl{} -g '^{}: '",
            d.unit
                .as_deref()
                .map_or(String::new(), |u| format!(" -u {u}")),
            log_names(d, shares)
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
        print_memory(m);
    }
    for q in &d.queues {
        print_queue(d.pid, &d.rdma_device, q);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_daemons_devices_count_its_channels_and_memory_once() {
        let dev = |pid, queues| DeviceState {
            pid,
            queues: vec![Default::default(); queues],
            memory: Some(srp_ublk::rdma::mem::MemCounts {
                pinned_bytes: 4 << 20,
                ..Default::default()
            }),
            ..Default::default()
        };
        // one daemon serving three LUNs over 2 channels, and a device with a daemon of its own
        let devs = [dev(10, 2), dev(10, 2), dev(10, 2), dev(20, 1)];
        assert_eq!(
            host_total(&devs, &[]),
            "total 4 device(s), 0 export(s), 3 channel(s), 8.0 MiB pinned"
        );
    }
}
