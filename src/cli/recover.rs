//! `srp-ublk recover`: after a daemon crash (or `kill -9`), log in again and take the device over
//! where it stands. ublk keeps the device quiesced, with the I/O that was in flight queued, until a
//! new daemon ends the recovery; the I/O is then issued again, so applications see no error.

use super::spawn::Announce;
use anyhow::bail;
use clap::Args;
use srp_ublk::session::state::DeviceState;
use srp_ublk::session::timers::show_tmo;
use std::ffi::OsString;

/// `srp-ublk recover ...`
#[derive(Debug, Args)]
pub struct RecoverArgs {
    /// The device: N, /dev/ublkbN or a path that leads to it (/dev/disk/by-id/...). The other
    /// devices its daemon served (a target port's) are recovered with it.
    #[arg(short = 'n', long = "number", value_name = "DEVICE", value_parser = super::device::parse,
          required_unless_present = "all")]
    pub id: Option<u32>,
    /// Every srp-ublk device whose daemon is gone.
    #[arg(long, short = 'a', conflicts_with = "id")]
    pub all: bool,
    /// Limit for each login step, in seconds.
    #[arg(long, default_value_t = 15)]
    pub timeout: u64,
    /// Report as JSON: an object per device (`device`, `ok`, `error`).
    #[arg(long)]
    pub json: bool,
}

/// Runs `recover`.
pub fn run(a: RecoverArgs) -> anyhow::Result<()> {
    super::add::check_ublk()?;
    let devs: Vec<DeviceState> = if a.all {
        DeviceState::all()
            .into_iter()
            .filter(|d| !super::daemon::alive(d))
            .collect()
    } else {
        let id = a.id.unwrap_or(0);
        let Ok(d) = DeviceState::read(&DeviceState::path(id)) else {
            return Err(super::status::failed(
                super::status::Exit::NotFound,
                format!(
                    "no state for /dev/ublkb{id} ({} is missing): it was not added by srp-ublk, \
                     or was deleted; add it again with `srp-ublk add`",
                    DeviceState::path(id).display()
                ),
            ));
        };
        if super::daemon::alive(&d) {
            bail!(
                "/dev/ublkb{id} is served by a running daemon (pid {}): nothing to recover",
                d.pid
            );
        }
        with_daemon_mates(d)
    };
    if devs.is_empty() {
        if a.json {
            println!("[]");
        } else {
            println!("nothing to recover: every srp-ublk device has its daemon");
        }
        return Ok(());
    }
    let mut report = super::report::Report::new(a.json);
    for group in by_daemon(devs) {
        let name = super::handover::names(&group);
        match recover_together(&group, a.timeout, a.json) {
            // the daemon's READY lines said it (the devices, or their JSON)
            Ok(()) => report.done(&name, String::new(), serde_json::json!({})),
            Err(e) => report.failed(&name, e.context(format!("recovering {name}"))),
        }
    }
    report.finish("recovered")
}

/// Device `d` and the other devices its dead daemon served (a target port's daemon serves every
/// LUN's): they went down together and are taken over together, over one set of channels.
fn with_daemon_mates(d: DeviceState) -> Vec<DeviceState> {
    let mut devs = vec![d];
    for o in DeviceState::all() {
        if o.dev_id != devs[0].dev_id && same_daemon(&devs[0], &o) {
            eprintln!(
                "{} lost the same daemon (pid {}): it is recovered with {}",
                o.bdev, o.pid, devs[0].bdev
            );
            devs.push(o);
        }
    }
    devs
}

/// Whether devices `a` and `b` were served by the same daemon (the same process, started at the
/// same time, of the same target).
fn same_daemon(a: &DeviceState, b: &DeviceState) -> bool {
    a.pid == b.pid && a.pid_start == b.pid_start && a.target == b.target
}

/// The devices by the daemon that served them: the devices of one target port's daemon are taken
/// over together, by one new daemon over one set of channels.
pub(crate) fn by_daemon(devs: Vec<DeviceState>) -> Vec<Vec<DeviceState>> {
    let mut groups: Vec<Vec<DeviceState>> = Vec::new();
    for d in devs {
        let same = |g: &Vec<DeviceState>| g.first().is_some_and(|f| same_daemon(f, &d));
        match groups.iter_mut().find(|g| same(g)) {
            Some(g) => g.push(d),
            None => groups.push(vec![d]),
        }
    }
    groups
}

/// Starts one daemon that takes `devs` over (one device, or those one target port's daemon
/// served); returns once every one is live.
pub(crate) fn recover_together(
    devs: &[DeviceState],
    timeout: u64,
    json: bool,
) -> anyhow::Result<()> {
    let out = if json {
        Announce::Quiet
    } else {
        Announce::Path
    };
    super::spawn::spawn_port_daemon(&port_argv(devs), timeout, out, devs.len())
}

/// The `add --recover` command line that takes devices `devs` over in one daemon (same target,
/// LUNs, queues, depth, completion mode and timers, each device id taken over): one device, or
/// the devices of every LUN of one target port (a daemon that served them together), each LUN
/// with its device id (`--ids`, in the order of `--lun`). Empty for no device.
pub(crate) fn port_argv(devs: &[DeviceState]) -> Vec<OsString> {
    joining_argv(devs, &[])
}

/// [`port_argv`] with the LUNs `joining` after the devices' own: the daemon's next image makes a
/// device for each (`--ids` names the devices taken over, in order; the LUNs past them are new).
pub(crate) fn joining_argv(devs: &[DeviceState], joining: &[u64]) -> Vec<OsString> {
    let Some(d) = devs.first() else {
        return Vec::new();
    };
    let join =
        |f: &dyn Fn(&DeviceState) -> String| devs.iter().map(f).collect::<Vec<_>>().join(",");
    let luns: Vec<u64> = devs
        .iter()
        .map(|d| d.lun)
        .chain(joining.iter().copied())
        .collect();
    let mut v: Vec<String> = vec![
        "add".into(),
        "--target".into(),
        d.target.clone(),
        "--lun".into(),
        super::port::list(&luns),
        "--queues".into(),
        d.queues.len().to_string(),
        "--depth".into(),
        d.depth.to_string(),
    ];
    if devs.len() == 1 && joining.is_empty() {
        v.extend(["-n".into(), d.dev_id.to_string()]);
    } else {
        v.extend(["--ids".into(), join(&|d| d.dev_id.to_string())]);
    }
    v.push("--recover".into());
    if let Some(o) = &d.owner {
        v.extend(["--owner".into(), o.clone()]);
    }
    if !d.poll.is_empty() {
        v.extend(["--poll".into(), d.poll.clone()]);
    }
    if !d.cpus.is_empty() {
        let cpus: Vec<String> = d.cpus.iter().map(usize::to_string).collect();
        v.extend(["--cpus".into(), cpus.join(",")]);
    }
    if let Some(t) = d.timers {
        v.extend([
            "--reconnect-delay".into(),
            show_tmo(t.reconnect_delay),
            "--fast-io-fail-tmo".into(),
            show_tmo(t.fast_io_fail_tmo),
            "--dev-loss-tmo".into(),
            show_tmo(t.dev_loss_tmo),
        ]);
    }
    v.into_iter().map(OsString::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;
    use srp_ublk::session::timers::Timers;

    #[test]
    fn the_recover_command_line_parses_back_to_the_same_device() {
        let d = DeviceState {
            dev_id: 3,
            target: "id_ext=000000fffe770001,ioc_guid=000000fffe770001,dest=10.77.0.1:5555".into(),
            lun: 2,
            depth: 32,
            poll: "interrupt".into(),
            timers: Some(Timers {
                reconnect_delay: Some(2),
                fast_io_fail_tmo: None,
                dev_loss_tmo: Some(60),
            }),
            queues: vec![Default::default(); 2],
            owner: Some("lab".into()),
            cpus: vec![0, 1],
            ..Default::default()
        };
        let mut args = vec![OsString::from("srp-ublk")];
        args.extend(port_argv(std::slice::from_ref(&d)));
        let cli = Cli::try_parse_from(args).unwrap();
        let Command::Add(a) = cli.command else {
            panic!("not an add")
        };
        assert!(a.recover);
        assert_eq!(a.id, Some(3));
        assert_eq!(a.session.lun, Some(crate::cli::LunSel::List(vec![2])));
        assert_eq!(a.session.queues, Some(2));
        assert_eq!(a.session.depth, 32);
        assert_eq!(a.timers().unwrap(), d.timers.unwrap());
        assert_eq!(a.target.as_deref(), Some(d.target.as_str()));
        assert_eq!(a.handover_since, None);
        assert_eq!(a.owner.as_deref(), Some("lab"));
        assert_eq!(
            a.cpus,
            [0, 1],
            "the next image pins its queues as this one does"
        );
        // what a daemon whose RDMA device is being removed execs (cli::add::hand_over)
        let mut args = vec![OsString::from("srp-ublk")];
        args.extend(port_argv(std::slice::from_ref(&d)));
        args.extend(["--handover-since".into(), "1764580000123".into()]);
        let Command::Add(a) = Cli::try_parse_from(args).unwrap().command else {
            panic!("not an add")
        };
        assert!(a.recover);
        assert_eq!(a.handover_since, Some(1764580000123));
    }

    #[test]
    fn a_port_daemons_devices_are_taken_over_together_each_lun_with_its_id() {
        let dev = |dev_id, lun, pid| DeviceState {
            dev_id,
            target: "id_ext=000000fffe770001,ioc_guid=000000fffe770001,dest=10.77.0.1:5555".into(),
            lun,
            depth: 32,
            pid,
            queues: vec![Default::default(); 2],
            ..Default::default()
        };
        // two daemons' devices, listed by id: the port daemon's (pid 10) go together
        let groups = by_daemon(vec![dev(0, 0, 10), dev(1, 5, 20), dev(2, 1, 10)]);
        let ids: Vec<Vec<u32>> = groups
            .iter()
            .map(|g| g.iter().map(|d| d.dev_id).collect())
            .collect();
        assert_eq!(ids, [vec![0, 2], vec![1]]);
        let mut args = vec![OsString::from("srp-ublk")];
        args.extend(port_argv(&groups[0]));
        let Command::Add(a) = Cli::try_parse_from(args).unwrap().command else {
            panic!("not an add")
        };
        assert!(a.recover);
        assert_eq!(a.id, None, "several devices: no -n");
        assert_eq!(a.ids, [0, 2]);
        assert_eq!(a.session.lun, Some(crate::cli::LunSel::List(vec![0, 1])));
        assert_eq!(a.session.queues, Some(2));
        assert!(port_argv(&[]).is_empty());
    }

    #[test]
    fn luns_joining_a_daemon_follow_its_devices_without_ids() {
        let d = DeviceState {
            dev_id: 4,
            target: "id_ext=000000fffe770001,ioc_guid=000000fffe770001,dest=10.77.0.1:5555".into(),
            lun: 2,
            depth: 32,
            queues: vec![Default::default(); 2],
            ..Default::default()
        };
        // one LUN's daemon joined by two: the next image is a port daemon of three LUNs
        let mut args = vec![OsString::from("srp-ublk")];
        args.extend(joining_argv(std::slice::from_ref(&d), &[8, 9]));
        let Command::Add(a) = Cli::try_parse_from(args).unwrap().command else {
            panic!("not an add")
        };
        assert!(a.recover);
        assert_eq!(a.id, None, "three LUNs: no -n");
        assert_eq!(
            a.ids,
            [4],
            "the device taken over, then the new LUNs' without ids"
        );
        assert_eq!(a.session.lun, Some(crate::cli::LunSel::List(vec![2, 8, 9])));
    }
}
