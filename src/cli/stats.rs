//! `srp-ublk stats`: what each device, export and queue is doing, from the counters its daemon or
//! server publishes in its state file: rates over an interval (IOPS and MB/s read and written, latency percentiles),
//! credit stalls, reconnects, aborts and errors; or every counter in the Prometheus text format, for
//! node_exporter's textfile collector.

use anyhow::{bail, Context};
use clap::Args;
use srp_ublk::rdma::mem::MemCounts;
use srp_ublk::session::exports::ExportState;
use srp_ublk::session::state::{DeviceState, QueueState};
use srp_ublk::stats::{bucket_upper_us, IoCounters, BUCKETS};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// `srp-ublk stats ...`
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// One device: N, /dev/ublkbN or a path that leads to it (/dev/disk/by-id/...); default:
    /// every srp-ublk device and export.
    #[arg(short = 'n', long = "number", value_name = "DEVICE", value_parser = super::device::parse)]
    pub id: Option<u32>,
    /// One export (`srp-ublk serve`'s --name, as `srp-ublk list` shows it).
    #[arg(long, value_name = "NAME", conflicts_with = "id")]
    pub export: Option<String>,
    /// Seconds over which rates are measured, at least: between two of the daemons' counter
    /// updates (every 2 s) that far apart.
    #[arg(long, default_value_t = 2.0)]
    pub interval: f64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Write every counter, in the Prometheus text format, to this file (atomically: for
    /// node_exporter's textfile collector) instead of measuring rates; "-" for stdout.
    #[arg(long, value_name = "FILE")]
    pub prometheus: Option<String>,
}

/// What `stats` reports on: a device or an export, with its queues.
struct Subject {
    /// What tells it apart from the others in one run (a device's number, an export's server).
    key: String,
    /// `/dev/ublkbN` or `export NAME`.
    name: String,
    /// Its Prometheus labels: `device="ublkbN",lun="L"` or `export="NAME",lun="L"`.
    label: String,
    updated_ms: u64,
    /// Whose process serves it: asked only for the Prometheus file (a device's costs a look at
    /// the kernel's ublk server, not for every sample of the rates).
    server: Server,
    queues: Vec<QueueState>,
    memory: Option<MemCounts>,
    /// An export's clients: connected now, and since it started.
    connections: Option<(u64, u64)>,
    /// A vhost-user-blk export (its queues count zero-copy and copied bytes).
    vhost: bool,
}

/// A subject's process, as its state file names it.
enum Server {
    /// A device's daemon (its state file, queues taken out).
    Device(Box<DeviceState>),
    /// An export's server (its state file, queues taken out).
    Export(Box<ExportState>),
}

impl Subject {
    fn device(mut d: DeviceState) -> Subject {
        Subject {
            key: format!("ublkb{}", d.dev_id),
            label: format!("device=\"ublkb{}\",lun=\"{}\"", d.dev_id, d.lun),
            name: d.bdev.clone(),
            updated_ms: d.updated_ms,
            queues: std::mem::take(&mut d.queues),
            memory: d.memory.take(),
            connections: None,
            vhost: false,
            server: Server::Device(Box::new(d)),
        }
    }

    /// Whether its daemon or server runs.
    fn alive(&self) -> bool {
        match &self.server {
            Server::Device(d) => super::daemon::alive(d),
            Server::Export(e) => e.alive(),
        }
    }

    fn export(mut e: ExportState) -> Subject {
        Subject {
            key: format!("export {} {}", e.name, e.pid),
            name: format!("export {}", e.name),
            label: format!("export=\"{}\",lun=\"{}\"", label_value(&e.name), e.lun),
            updated_ms: e.updated_ms,
            queues: std::mem::take(&mut e.queues),
            memory: e.memory.take(),
            connections: Some((e.connections, e.connections_total)),
            vhost: e.kind == "vhost-user-blk",
            server: Server::Export(Box::new(e)),
        }
    }
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn subjects(a: &StatsArgs) -> anyhow::Result<Vec<Subject>> {
    if let Some(id) = a.id {
        return Ok(vec![Subject::device(super::device::state(id)?)]);
    }
    let exports = ExportState::all().into_iter();
    let Some(name) = &a.export else {
        let devs = DeviceState::all().into_iter().map(Subject::device);
        return Ok(devs.chain(exports.map(Subject::export)).collect());
    };
    let found: Vec<Subject> = exports
        .filter(|e| &e.name == name)
        .map(Subject::export)
        .collect();
    if found.is_empty() {
        return Err(super::status::not_found(format!(
            "no srp-ublk export named '{name}' (see `srp-ublk list`)"
        ))
        .into());
    }
    Ok(found)
}

/// Runs `stats`.
pub fn run(a: StatsArgs) -> anyhow::Result<()> {
    if let Some(out) = &a.prometheus {
        let text = prometheus(&subjects(&a)?);
        if out == "-" {
            print!("{text}");
            return Ok(());
        }
        let tmp = format!("{out}.tmp");
        std::fs::write(&tmp, &text).with_context(|| format!("writing {tmp}"))?;
        return std::fs::rename(&tmp, out).with_context(|| format!("renaming {tmp} to {out}"));
    }
    if !(a.interval > 0.0 && a.interval <= 3600.0) {
        bail!("--interval {}: give seconds from 0.1 to 3600", a.interval);
    }
    let before = subjects(&a)?;
    std::thread::sleep(Duration::from_secs_f64(a.interval));
    // then the next update of every device's counters (a dead daemon's never comes)
    let deadline = Instant::now() + Duration::from_secs(5);
    let after = loop {
        let now = subjects(&a)?;
        let fresh = now.iter().all(|d| {
            before
                .iter()
                .find(|b| b.key == d.key)
                .is_none_or(|b| d.updated_ms > b.updated_ms)
        });
        if fresh || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let rows: Vec<Rates> = after
        .iter()
        .map(|d| {
            let was = before.iter().find(|b| b.key == d.key);
            let ms = was.map_or(0, |w| d.updated_ms.saturating_sub(w.updated_ms));
            let secs = if ms > 0 {
                ms as f64 / 1000.0
            } else {
                a.interval
            };
            Rates::of(d, was, secs)
        })
        .collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        for r in &rows {
            print!("{}", r.text());
        }
    }
    Ok(())
}

/// One device's (or queue's) rates over the interval.
#[derive(Debug, serde::Serialize)]
struct Rates {
    /// `/dev/ublkbN`, `export NAME`, or `qN` for a queue.
    name: String,
    read_iops: f64,
    read_mb_s: f64,
    write_iops: f64,
    write_mb_s: f64,
    other_iops: f64,
    /// Latency percentiles over the interval, microseconds (p50, p90, p99, p99.9).
    latency_us: Option<[u64; 4]>,
    errors: u64,
    #[serde(flatten)]
    events: Events,
    /// An export's clients connected now.
    #[serde(skip_serializing_if = "Option::is_none")]
    connections: Option<u64>,
    queues: Vec<Rates>,
}

/// What happened to a queue's (or a device's) commands over the interval.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
struct Events {
    /// Commands that waited for the target's credit.
    credit_stalls: u64,
    /// Commands that had their credit but waited for a free send slot.
    slot_stalls: u64,
    /// Commands that waited for room in the queue's buffers.
    buffer_stalls: u64,
    reconnects: u64,
    aborts: u64,
}

impl Events {
    fn sum(all: impl Iterator<Item = Events>) -> Events {
        all.fold(Events::default(), |a, e| Events {
            credit_stalls: a.credit_stalls + e.credit_stalls,
            slot_stalls: a.slot_stalls + e.slot_stalls,
            buffer_stalls: a.buffer_stalls + e.buffer_stalls,
            reconnects: a.reconnects + e.reconnects,
            aborts: a.aborts + e.aborts,
        })
    }
}

impl Rates {
    fn of(d: &Subject, was: Option<&Subject>, secs: f64) -> Rates {
        let queues: Vec<Rates> = d
            .queues
            .iter()
            .map(|q| {
                let b = was.and_then(|w| w.queues.iter().find(|x| x.qid == q.qid));
                let io = q.io.since(&b.map(|b| b.io.clone()).unwrap_or_default());
                let delta = |now: u64, f: CounterGet| now.saturating_sub(b.map_or(0, f));
                Rates::from_io(
                    format!("q{}", q.qid),
                    &io,
                    secs,
                    Events {
                        credit_stalls: delta(q.credit_stalls, |x| x.credit_stalls),
                        slot_stalls: delta(q.slot_stalls, |x| x.slot_stalls),
                        buffer_stalls: delta(q.buffer_stalls, |x| x.buffer_stalls),
                        reconnects: delta(q.reconnects, |x| x.reconnects),
                        aborts: delta(q.aborts, |x| x.aborts),
                    },
                    Vec::new(),
                )
            })
            .collect();
        let mut all = IoCounters::default();
        for q in &d.queues {
            let b = was.and_then(|w| w.queues.iter().find(|x| x.qid == q.qid));
            all.add(&q.io.since(&b.map(|b| b.io.clone()).unwrap_or_default()));
        }
        let events = Events::sum(queues.iter().map(|q| q.events));
        Rates {
            connections: d.connections.map(|c| c.0),
            ..Rates::from_io(d.name.clone(), &all, secs, events, queues)
        }
    }

    fn from_io(
        name: String,
        io: &IoCounters,
        secs: f64,
        events: Events,
        queues: Vec<Rates>,
    ) -> Rates {
        let per = |n: u64| n as f64 / secs;
        let pct = [0.5, 0.9, 0.99, 0.999].map(|p| io.percentile(p));
        Rates {
            name,
            read_iops: per(io.read_ops),
            read_mb_s: per(io.read_bytes) / 1e6,
            write_iops: per(io.write_ops),
            write_mb_s: per(io.write_bytes) / 1e6,
            other_iops: per(io.other_ops),
            latency_us: pct[0].map(|_| pct.map(|p| p.unwrap_or(0))),
            errors: io.errors,
            events,
            connections: None,
            queues,
        }
    }

    fn line(&self) -> String {
        let lat = self.latency_us.map_or("latency -".to_string(), |l| {
            format!(
                "latency p50 {} p90 {} p99 {} p99.9 {}",
                us(l[0]),
                us(l[1]),
                us(l[2]),
                us(l[3])
            )
        });
        format!(
            "read {:.0} IOPS {:.1} MB/s  write {:.0} IOPS {:.1} MB/s  other {:.0}/s  {lat}  errors {}  \
             credit stalls {}  slot stalls {}  buffer stalls {}  reconnects {}  aborts {}",
            self.read_iops,
            self.read_mb_s,
            self.write_iops,
            self.write_mb_s,
            self.other_iops,
            self.errors,
            self.events.credit_stalls,
            self.events.slot_stalls,
            self.events.buffer_stalls,
            self.events.reconnects,
            self.events.aborts
        )
    }

    fn text(&self) -> String {
        let clients = self
            .connections
            .map_or(String::new(), |c| format!("  connections {c}"));
        let mut s = format!("{}  {}{clients}\n", self.name, self.line());
        for q in &self.queues {
            let _ = writeln!(s, "    {}  {}", q.name, q.line());
        }
        s
    }
}

/// A latency for people: microseconds below 10 ms, else milliseconds.
fn us(v: u64) -> String {
    if v < 10_000 {
        format!("{v} us")
    } else {
        format!("{:.1} ms", v as f64 / 1000.0)
    }
}

/// Histogram bounds exported: 2^k - 1 microseconds (exact bucket edges), 15 us to about 8.4 s.
const LE_POW2: std::ops::RangeInclusive<u32> = 4..=23;

/// How a queue's counter is read from its state.
type CounterGet = fn(&QueueState) -> u64;

/// The per-queue counters `stats --prometheus` exports: name, help text, and where it is read.
const COUNTERS: [(&str, &str, CounterGet); 11] = [
    ("srp_ublk_read_ops_total", "Reads completed.", |q| {
        q.io.read_ops
    }),
    ("srp_ublk_read_bytes_total", "Bytes read.", |q| {
        q.io.read_bytes
    }),
    ("srp_ublk_write_ops_total", "Writes completed.", |q| {
        q.io.write_ops
    }),
    ("srp_ublk_write_bytes_total", "Bytes written.", |q| {
        q.io.write_bytes
    }),
    (
        "srp_ublk_other_ops_total",
        "Flush, discard and write-zeroes operations completed.",
        |q| q.io.other_ops,
    ),
    (
        "srp_ublk_io_errors_total",
        "Operations that ended with an error.",
        |q| q.io.errors,
    ),
    (
        "srp_ublk_credit_stalls_total",
        "Times a command waited for SRP credits.",
        |q| q.credit_stalls,
    ),
    (
        "srp_ublk_send_slot_stalls_total",
        "Times a command had its credit but waited for a free send slot.",
        |q| q.slot_stalls,
    ),
    (
        "srp_ublk_buffer_stalls_total",
        "Times a command waited for room in its queue's registered buffers.",
        |q| q.buffer_stalls,
    ),
    (
        "srp_ublk_reconnects_total",
        "Channel reconnects that succeeded.",
        |q| q.reconnects,
    ),
    (
        "srp_ublk_aborts_total",
        "Commands aborted after timing out.",
        |q| q.aborts,
    ),
];

/// Every counter of `subjects`, in the Prometheus text format (what node_exporter's textfile
/// collector reads), names after the Prometheus conventions (`_total` counters, base units: bytes,
/// seconds). Devices are labelled `device`, exports `export`; both `lun` and `queue`.
fn prometheus(subjects: &[Subject]) -> String {
    let label = |d: &Subject, q: u16| format!("{},queue=\"{q}\"", d.label);
    let mut s = String::new();
    for (name, help, get) in COUNTERS {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter");
        for d in subjects {
            for q in &d.queues {
                let _ = writeln!(s, "{name}{{{}}} {}", label(d, q.qid), get(q));
            }
        }
    }
    let name = "srp_ublk_queue_running";
    let _ = writeln!(s, "# HELP {name} 1 while the queue's SRP channel carries I/O, 0 while it is down.\n# TYPE {name} gauge");
    for d in subjects {
        let alive = d.alive();
        for q in &d.queues {
            let up = u8::from(q.state == "running" && alive);
            let _ = writeln!(s, "{name}{{{}}} {up}", label(d, q.qid));
        }
    }
    memory(&mut s, subjects);
    exports(&mut s, subjects);
    let name = "srp_ublk_io_latency_seconds";
    let _ = writeln!(s, "# HELP {name} Time from the request (the block layer's, the NBD client's SRP command, the guest's) to its completion.\n# TYPE {name} histogram");
    for d in subjects {
        for q in &d.queues {
            latency_histogram(&mut s, name, &label(d, q.qid), q);
        }
    }
    s
}

/// Each device's daemon's (and export's server's) registrations with its RDMA devices (absent
/// for older daemons).
fn memory(s: &mut String, subjects: &[Subject]) {
    type Get = fn(&MemCounts) -> u64;
    let metrics: [(&str, &str, &str, Get); 3] = [
        (
            "srp_ublk_protection_domains_total",
            "counter",
            "RDMA protection domains the device's daemon allocated (one per RDMA device used).",
            |m| m.domains,
        ),
        (
            "srp_ublk_registrations_total",
            "counter",
            "Data buffer regions the device's daemon registered (a reconnect on the same RDMA \
             device adds none).",
            |m| m.registrations,
        ),
        (
            "srp_ublk_pinned_bytes",
            "gauge",
            "Bytes of data buffers the device's daemon has registered (pinned) now.",
            |m| m.pinned_bytes,
        ),
    ];
    for (name, kind, help, get) in metrics {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for d in subjects {
            if let Some(m) = &d.memory {
                let _ = writeln!(s, "{name}{{{}}} {}", d.label, get(m));
            }
        }
    }
}

/// Exports' clients, and the bytes each vhost-user-blk queue moved without and with a copy.
fn exports(s: &mut String, subjects: &[Subject]) {
    type Get = fn((u64, u64)) -> u64;
    let clients: [(&str, &str, &str, Get); 2] = [
        (
            "srp_ublk_export_connections",
            "gauge",
            "Clients connected to the export now.",
            |c| c.0,
        ),
        (
            "srp_ublk_export_connections_total",
            "counter",
            "Clients that connected to the export since its server started.",
            |c| c.1,
        ),
    ];
    for (name, kind, help, get) in clients {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for d in subjects {
            if let Some(c) = d.connections {
                let _ = writeln!(s, "{name}{{{}}} {}", d.label, get(c));
            }
        }
    }
    let copies: [(&str, &str, CounterGet); 2] = [
        (
            "srp_ublk_zero_copy_bytes_total",
            "Data bytes the target moved straight to or from a guest's memory (vhost-user-blk).",
            |q| q.zero_copy_bytes,
        ),
        (
            "srp_ublk_copied_bytes_total",
            "Data bytes copied through the queue's buffers (vhost-user-blk requests one SRP \
             command cannot carry as they are).",
            |q| q.copied_bytes,
        ),
    ];
    for (name, help, get) in copies {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter");
        for d in subjects.iter().filter(|d| d.vhost) {
            for q in &d.queues {
                let _ = writeln!(s, "{name}{{{},queue=\"{}\"}} {}", d.label, q.qid, get(q));
            }
        }
    }
}

/// One queue's latency histogram in Prometheus' cumulative buckets (`le` at powers of two
/// microseconds), with its sum and count.
fn latency_histogram(s: &mut String, name: &str, l: &str, q: &QueueState) {
    let lat = &q.io.lat;
    let mut cum = 0u64;
    let mut i = 0;
    for k in LE_POW2 {
        let edge = (1u64 << k) - 1;
        while i < lat.len().min(BUCKETS) && bucket_upper_us(i) <= edge {
            cum += lat[i];
            i += 1;
        }
        let _ = writeln!(s, "{name}_bucket{{{l},le=\"{}\"}} {cum}", edge as f64 / 1e6);
    }
    let count: u64 = lat.iter().sum();
    let _ = writeln!(s, "{name}_bucket{{{l},le=\"+Inf\"}} {count}");
    let _ = writeln!(s, "{name}_sum{{{l}}} {}", q.io.lat_sum_us as f64 / 1e6);
    let _ = writeln!(s, "{name}_count{{{l}}} {count}");
}
