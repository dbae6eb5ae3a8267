//! `srp-ublk up` / `down`: attach and detach the targets configured under
//! `/etc/srp-ublk/targets.d/NAME.conf` (one target a file, `key = value` lines with `add`'s option
//! names: target, lun, queues, depth, timeout, cpus, poll, reconnect-delay, fast-io-fail-tmo,
//! dev-loss-tmo; `#` comments). `up` adds each LUN's device, or recovers it when a device of that
//! target and LUN is left without its daemon; with `--supervise` (the systemd unit) it then tells
//! systemd it is ready and exits with an error as soon as one of its devices loses its daemon, so
//! `Restart=on-failure` brings it back through ublk recovery; it also looks for new LUNs of targets
//! configured with `lun = all` every `--rescan` seconds and attaches them.

use super::add::{without_lun, AddArgs};
use super::spawn::{spawn_port_daemon, Announce};
use super::{Cli, Command, LunSel};
use anyhow::{bail, Context};
use clap::{Args, Parser};
use srp_ublk::session::state::DeviceState;
use srp_ublk::wire::target::TargetSpec;
use std::path::Path;
use std::time::Duration;

/// The keys a target file may set (`add`'s long options).
const KEYS: [&str; 10] = [
    "target",
    "lun",
    "queues",
    "depth",
    "timeout",
    "cpus",
    "poll",
    "reconnect-delay",
    "fast-io-fail-tmo",
    "dev-loss-tmo",
];

/// `srp-ublk up ...`
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Target files to attach, by name (NAME of targets.d/NAME.conf); default: every one.
    pub names: Vec<String>,
    /// After attaching: tell systemd (sd_notify READY=1) and stay, exiting with an error when one
    /// of the devices loses its daemon (for srp-ublk@.service).
    #[arg(long)]
    pub supervise: bool,
    /// Instead of attaching: start srp-ublk@NAME.service for every target file (for the unit udev
    /// starts when an RDMA port appears).
    #[arg(long, conflicts_with = "supervise")]
    pub start_units: bool,
    /// With --supervise: seconds between looks for new LUNs of targets configured with
    /// `lun = all` (a LUN mapped on the target at run time gets its device), 0 for never. A
    /// REPORTED LUNS DATA HAS CHANGED unit attention on any device makes it look at once.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub rescan: u64,
}

/// `srp-ublk down ...`
#[derive(Debug, Args)]
pub struct DownArgs {
    /// Target files to detach, by name; default: every one.
    pub names: Vec<String>,
    /// Seconds to wait for each device to go away.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// As a unit's ExecStop=: detach only when the unit is stopped on purpose. systemd runs
    /// ExecStop= also after the supervisor exited on its own (a device lost its daemon), with
    /// $MAINPID unset; the devices are then kept, for Restart= to recover them.
    #[arg(long)]
    pub unit_stop: bool,
    /// Report as JSON: an object per device deleted or not (`device`, `target`, `ok`, `error`).
    #[arg(long)]
    pub json: bool,
}

/// A target file, read.
struct Conf {
    name: String,
    /// Its `add` options.
    argv: Vec<String>,
    add: AddArgs,
    target: TargetSpec,
}

/// The `add` arguments of a target file's text.
fn conf_argv(text: &str, file: &Path) -> anyhow::Result<Vec<String>> {
    let keys = super::conf::Keys {
        values: &KEYS,
        flags: &[],
        required: "target",
    };
    super::conf::argv(text, file, &keys)
}

fn read_conf(name: &str) -> anyhow::Result<Conf> {
    let file = super::conf::targets_dir().join(format!("{name}.conf"));
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("cannot read target file {}", file.display()))?;
    let argv = conf_argv(&text, &file)?;
    let cli = Cli::try_parse_from(
        ["srp-ublk", "add"]
            .into_iter()
            .map(String::from)
            .chain(argv.iter().cloned()),
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let Command::Add(add) = cli.command else {
        unreachable!("parsed as add")
    };
    let t = add.target.as_deref().unwrap_or_default();
    if !t.contains('=') {
        bail!(
            "{}: target = {t}: a target file needs the full target string (a bare GUID would be \
             looked up again at every up and down); `srp-ublk discover --ib` or `--dest` prints it",
            file.display()
        );
    }
    let target = TargetSpec::parse(t).with_context(|| format!("in {}", file.display()))?;
    Ok(Conf {
        name: name.to_string(),
        argv,
        add,
        target,
    })
}

/// The names given, or every target file.
fn names(given: &[String]) -> anyhow::Result<Vec<String>> {
    if !given.is_empty() {
        return Ok(given.to_vec());
    }
    let dir = super::conf::targets_dir();
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_suffix(".conf").map(String::from)
        })
        .collect();
    v.sort();
    Ok(v)
}

/// The LUNs a target file asks for.
fn luns(c: &Conf) -> anyhow::Result<Vec<u64>> {
    Ok(match &c.add.session.lun {
        Some(LunSel::All) => srp_ublk::session::discover::discover_luns(
            &c.target,
            Duration::from_secs(c.add.session.timeout),
        )?
        .into_iter()
        .filter(|f| f.info.is_ok())
        .map(|f| f.lun)
        .collect(),
        Some(LunSel::List(l)) => l.clone(),
        None => vec![c.target.lun.unwrap_or(0)],
    })
}

/// The device serving LUN `lun` of `c`'s target, if there is one.
fn device_of(c: &Conf, lun: u64) -> Option<DeviceState> {
    DeviceState::of_nexus(&c.target)
        .into_iter()
        .find(|d| d.lun == lun)
}

/// Brings every LUN of `c` up (with `quiet`, says nothing of LUNs already up); returns the device
/// ids. The LUNs with no device yet get one daemon for all of them (the target port's channels
/// shared, as `add --lun all` does).
fn up_one(c: &Conf, quiet: bool) -> anyhow::Result<Vec<u32>> {
    let luns = luns(c)?;
    let (mut missing, mut dead) = (Vec::new(), Vec::new());
    for &lun in &luns {
        match device_of(c, lun) {
            Some(d) if super::daemon::alive(&d) => {
                if !quiet {
                    println!("{}: LUN {lun} is up: {}", c.name, d.bdev)
                }
            }
            Some(d) => {
                println!(
                    "{}: LUN {lun}: {} lost its daemon: recovering",
                    c.name, d.bdev
                );
                dead.push(d);
            }
            None => missing.push(lun),
        }
    }
    // the devices one daemon served are taken over together
    for group in super::recover::by_daemon(dead) {
        super::recover::recover_together(&group, c.add.session.timeout, false)?;
    }
    // a LUN mapped at run time joins the daemon serving the port's other LUNs
    let daemon = super::join::port_daemon(&c.target, Some(&c.name));
    let list: Vec<String> = missing.iter().map(u64::to_string).collect();
    if let (false, Some(devs)) = (missing.is_empty(), daemon) {
        print!("{}: LUN {}: ", c.name, list.join(", "));
        super::join::join(&devs, &missing, c.add.session.timeout, Announce::Path)?;
    } else if !missing.is_empty() {
        let conf: Vec<std::ffi::OsString> = c.argv.iter().map(Into::into).collect();
        let mut argv: Vec<std::ffi::OsString> = vec!["add".into()];
        argv.extend(without_lun(&conf));
        argv.extend(["--lun".into(), list.join(",").into()]);
        argv.extend(["--owner".into(), c.name.clone().into()]);
        print!("{}: LUN {}: ", c.name, list.join(", "));
        spawn_port_daemon(&argv, c.add.session.timeout, Announce::Path, missing.len())?;
    }
    Ok(luns
        .iter()
        .filter_map(|&lun| device_of(c, lun))
        .map(|d| d.dev_id)
        .collect())
}

/// Runs `up`.
pub fn run_up(a: UpArgs) -> anyhow::Result<()> {
    let names = names(&a.names)?;
    if a.start_units {
        return start_units(&names);
    }
    super::add::check_ublk()?;
    let confs = names
        .iter()
        .map(|n| read_conf(n))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut ids = Vec::new();
    for c in &confs {
        ids.extend(up_one(c, false).with_context(|| format!("bringing {} up", c.name))?);
    }
    if !a.supervise {
        return Ok(());
    }
    notify_ready()?;
    supervise(&confs, ids, a.rescan)
}

/// `up --start-units`: each target's `srp-ublk@NAME.service`, started without waiting for it.
fn start_units(names: &[String]) -> anyhow::Result<()> {
    for n in names {
        let unit = format!("srp-ublk@{n}.service");
        let st = std::process::Command::new("systemctl")
            .args(["--no-block", "start", &unit])
            .status()
            .context("running systemctl")?;
        if !st.success() {
            bail!("systemctl start {unit} failed ({st})");
        }
    }
    Ok(())
}

/// `up --supervise`: watches the devices `ids` every second until one is deleted (the unit's
/// work is done) or loses its daemon (an error, so that systemd restarts the unit, which recovers
/// it); looks for new LUNs of the `lun=all` targets every `rescan` seconds (0: never) and when a
/// target reports that its LUNs changed.
fn supervise(confs: &[Conf], mut ids: Vec<u32>, rescan: u64) -> anyhow::Result<()> {
    let mut last_scan = std::time::Instant::now();
    // per device: the REPORTED LUNS DATA HAS CHANGED unit attentions its queues have seen
    let mut luns_changed: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        reap_children();
        let Some(changed) = watch(&ids, &mut luns_changed)? else {
            return Ok(());
        };
        let due = rescan > 0 && last_scan.elapsed() >= Duration::from_secs(rescan);
        if !(due || changed) {
            continue;
        }
        if changed {
            println!("a target reported that its LUNs changed: looking for new ones");
        }
        last_scan = std::time::Instant::now();
        for c in confs
            .iter()
            .filter(|c| c.add.session.lun == Some(LunSel::All))
        {
            match up_one(c, true) {
                Ok(now) => {
                    for i in now {
                        if !ids.contains(&i) {
                            ids.push(i);
                        }
                    }
                }
                Err(e) => eprintln!(
                    "srp-ublk: warning: looking for new LUNs of {}: {e:#}",
                    c.name
                ),
            }
        }
    }
}

/// One look at the supervised devices: whether a target reported that its LUNs changed since the
/// last look, `None` once one of them was deleted, an error when one lost its daemon.
fn watch(
    ids: &[u32],
    luns_changed: &mut std::collections::HashMap<u32, u64>,
) -> anyhow::Result<Option<bool>> {
    let mut changed = false;
    for id in ids {
        match DeviceState::read(&DeviceState::path(*id)) {
            Ok(d) if !super::daemon::alive(&d) => bail!(
                "{} lost its daemon (pid {}): exiting so that systemd restarts the unit, \
                 which recovers it",
                d.bdev,
                d.pid
            ),
            Ok(d) => {
                let n: u64 = d.queues.iter().map(|q| q.luns_changed).sum();
                changed |= luns_changed.insert(*id, n).is_some_and(|was| n > was);
            }
            Err(_) => {
                // deleted (`srp-ublk down` as the unit stops, or `del`): nothing to watch
                println!("/dev/ublkb{id} was deleted: the target is no longer up");
                return Ok(None);
            }
        }
    }
    Ok(Some(changed))
}

/// Runs `down`.
pub fn run_down(a: DownArgs) -> anyhow::Result<()> {
    if a.unit_stop && std::env::var_os("MAINPID").is_none_or(|p| p.is_empty()) {
        println!(
            "the supervisor exited on its own ({}): devices kept for the unit's restart to recover",
            std::env::var("SERVICE_RESULT").unwrap_or_else(|_| "no result given".into())
        );
        return Ok(());
    }
    let mut report = super::report::Report::new(a.json);
    for n in names(&a.names)? {
        let c = read_conf(&n)?;
        for d in DeviceState::of_nexus(&c.target) {
            if d.owner.as_deref() != Some(n.as_str()) {
                // another target file's device, or one added by hand, on the same I_T nexus
                let note = format!(
                    "{n}: left {} (LUN {}) alone: {}",
                    d.bdev,
                    d.lun,
                    d.owner
                        .as_deref()
                        .map_or("added by hand".into(), |o| format!("attached by '{o}'"))
                );
                // JSON on stdout stays one document
                if a.json {
                    eprintln!("{note}");
                } else {
                    println!("{note}");
                }
                continue;
            }
            let target = serde_json::json!({"target": n});
            match super::del::del_one(&d, Duration::from_secs(a.timeout)) {
                Ok(()) => report.done(&d.bdev, format!("{n}: deleted {}", d.bdev), target),
                Err(e) => report.failed(&d.bdev, e.context(format!("target file {n}"))),
            }
        }
    }
    report.finish("deleted")
}

/// Reaps the daemons this supervisor started that have exited (`del`, or killed), so that none
/// stays a zombie while the supervisor runs.
fn reap_children() {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    while let Ok(st) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if st == WaitStatus::StillAlive {
            break;
        }
    }
}

/// sd_notify(READY=1) when systemd asked for it ($NOTIFY_SOCKET: a path, or @abstract).
fn notify_ready() -> anyhow::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(());
    };
    let p = path.to_string_lossy();
    let addr = match p.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None => SocketAddr::from_pathname(&*p)?,
    };
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(b"READY=1\nSTATUS=every device is live", &addr)
        .context("notifying systemd")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_files_map_to_add_options() {
        let f = Path::new("t.conf");
        let argv = conf_argv(
            "# lab target\ntarget = id_ext=1,ioc_guid=1,dest=10.77.0.1:5555  # the LUNs\n\
             lun = all\nfast_io_fail_tmo = 5\n\n",
            f,
        )
        .unwrap();
        assert_eq!(
            argv,
            [
                "--target",
                "id_ext=1,ioc_guid=1,dest=10.77.0.1:5555",
                "--lun",
                "all",
                "--fast-io-fail-tmo",
                "5"
            ]
        );
        let e = conf_argv("target = x\nbogus = 1\n", f).unwrap_err();
        assert!(
            e.to_string().contains("t.conf:2: unknown key 'bogus'"),
            "{e}"
        );
        let e = conf_argv("lun = 1\n", f).unwrap_err();
        assert!(e.to_string().contains("no target"), "{e}");
        let e = conf_argv("target\n", f).unwrap_err();
        assert!(e.to_string().contains("expected key = value"), "{e}");
    }

    #[test]
    fn the_packaged_example_parses_with_its_commented_keys_too() {
        let text = include_str!("../../packaging/example.conf");
        let f = Path::new("example.conf");
        let argv = conf_argv(text, f).unwrap();
        assert_eq!(argv[..4], ["--target", argv[1].as_str(), "--lun", "all"]);
        // every commented-out `key = value` line is a key `up` takes
        let on: String = text
            .lines()
            .map(|l| match l.strip_prefix('#') {
                Some(rest) if rest.contains(" = ") && !rest.starts_with(' ') => rest,
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let all = conf_argv(&on, f).unwrap();
        assert_eq!(all.len(), 4 + 2 * 5, "{all:?}");
    }
}
