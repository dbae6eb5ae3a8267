//! `srp-ublk discover --dest IP[:PORT]`: what an RDMA/CM (RoCE, iWARP) target offers, as target
//! strings `srp-ublk add --target` takes as printed, one per LUN, with what the LUN is.
//! `srp-ublk discover --ib [DEVICE[:PORT]]`: the SRP targets of an InfiniBand fabric, found as
//! srp_daemon finds them (subnet manager, then each port's device management agent), printed as
//! `srp_daemon -o` prints them, filtered and extended by srp_daemon.conf-style rules.

use anyhow::{bail, Context};
use clap::Args;
use srp_ublk::rdma::neigh;
use srp_ublk::rdma::umad::Umad;
use srp_ublk::session::discover::{discover_luns, FoundLun};
use srp_ublk::session::ib_discover;
use srp_ublk::session::SessionError;
use srp_ublk::wire::target::Rules;
use srp_ublk::wire::target::TargetSpec;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// LIO's usual RDMA/CM port (`srpt/discovery_auth/rdma_cm_port`).
const DEFAULT_PORT: u16 = 5555;

/// `srp-ublk discover ...`
#[derive(Debug, Args)]
pub struct DiscoverArgs {
    /// The target's address: IP[:PORT] (port 5555 when left out).
    #[arg(long, required_unless_present_any = ["target", "ib"], conflicts_with = "target")]
    pub dest: Option<String>,
    /// InfiniBand: find the fabric's SRP targets through this port (DEVICE[:PORT]; alone, the
    /// first active InfiniBand port), as `srp_daemon -o` does.
    #[arg(long, value_name = "DEVICE[:PORT]", num_args = 0..=1, default_missing_value = "",
          conflicts_with_all = ["dest", "target"])]
    pub ib: Option<String>,
    /// With --ib: an srp_daemon.conf-style rules file (default /etc/srp_daemon.conf when it
    /// exists, as srp_daemon's -f): disallowed targets are left out, allowed ones get the rule's
    /// options.
    #[arg(long, short = 'f', requires = "ib")]
    pub rules: Option<std::path::PathBuf>,
    /// A full target string instead (lists its LUNs).
    #[arg(long, short = 't')]
    pub target: Option<String>,
    /// The target port's id_ext (hex). Default: the EUI-64 of the target's MAC address, which is
    /// LIO's default on soft-RoCE (its first HCA's node GUID); on the target,
    /// /sys/module/ib_srpt/parameters/srpt_service_guid says.
    #[arg(long, value_parser = parse_guid)]
    pub id_ext: Option<u64>,
    /// The target's ioc_guid (hex). Default: id_ext.
    #[arg(long, value_parser = parse_guid)]
    pub ioc_guid: Option<u64>,
    /// Extra target options for the strings, e.g. "src=10.0.0.2,initiator_ext=5".
    #[arg(long)]
    pub options: Option<String>,
    /// Limit for each login step, in seconds.
    #[arg(long, default_value_t = 15)]
    pub timeout: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_guid(s: &str) -> Result<u64, String> {
    let d = s.trim_start_matches("0x").replace(':', "");
    u64::from_str_radix(&d, 16).map_err(|_| format!("'{s}': expected up to 16 hex digits"))
}

fn parse_dest(s: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Ok(sa);
    }
    let ip: IpAddr = s
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .with_context(|| format!("--dest '{s}': expected IP or IP:PORT"))?;
    Ok(SocketAddr::new(ip, DEFAULT_PORT))
}

fn spec(
    dest: SocketAddr,
    id_ext: u64,
    ioc_guid: u64,
    extra: Option<&str>,
) -> anyhow::Result<TargetSpec> {
    let t = TargetSpec::parse(&format!(
        "id_ext={id_ext:016x},ioc_guid={ioc_guid:016x},dest={dest}"
    ))?;
    Ok(match extra {
        Some(o) => t.with_options(o)?,
        None => t,
    })
}

/// srp_daemon's rules file.
const SRP_DAEMON_CONF: &str = "/etc/srp_daemon.conf";

/// Opens the umad device of `ib` (DEVICE[:PORT], or "" for the first active InfiniBand port).
pub fn open_ib(ib: &str) -> anyhow::Result<Umad> {
    Ok(Umad::open((!ib.is_empty()).then_some(ib))?)
}

/// `discover --ib`.
fn run_ib(ib: &str, rules: Option<&std::path::Path>, json: bool) -> anyhow::Result<()> {
    // srp_daemon's own rules file is read when there is one; a file given must be readable
    let (f, given) = match rules {
        Some(f) => (f.to_path_buf(), true),
        None => (std::path::PathBuf::from(SRP_DAEMON_CONF), false),
    };
    let rules = match std::fs::read_to_string(&f) {
        Ok(text) => Some(Rules::parse(&text).with_context(|| format!("in {}", f.display()))?),
        Err(e) if given => bail!("cannot read {}: {e}", f.display()),
        Err(_) => None,
    };
    let mut u = open_ib(ib)?;
    let found = ib_discover::discover(&mut u)?;
    for s in &found.skipped {
        eprintln!("srp-ublk: warning: {s}");
    }
    let mut out = Vec::new();
    for t in &found.targets {
        let spec = TargetSpec::parse(&t.line)?;
        let spec = match &rules {
            Some(r) => match r.apply(&spec)? {
                Some(s) => s,
                None => continue,
            },
            None => spec,
        };
        out.push((spec, t));
    }
    if json {
        let v: Vec<serde_json::Value> = out
            .iter()
            .map(|(s, t)| {
                serde_json::json!({
                    "target": s.to_string(), "lid": t.lid, "pkey": t.pkey,
                    "ioc_guid": format!("{:016x}", t.ioc.guid), "ioc_id": t.ioc.id,
                    "io_class": format!("{:04x}", t.ioc.io_class),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for (s, _) in &out {
            println!("{s}");
        }
    }
    if found.targets.is_empty() {
        eprintln!(
            "no SRP target found through {} port {} (the subnet manager at LID {:#x} knows no              device-management port offering an SRP service)",
            u.local.device, u.local.port, u.local.sm_lid
        );
    }
    Ok(())
}

/// Runs `discover`.
pub fn run(a: DiscoverArgs) -> anyhow::Result<()> {
    if let Some(ib) = &a.ib {
        return run_ib(ib, a.rules.as_deref(), a.json);
    }
    let timeout = Duration::from_secs(a.timeout);
    let target = match (&a.target, &a.dest) {
        (Some(t), _) => TargetSpec::parse(t)?,
        (None, Some(d)) => {
            let dest = parse_dest(d)?;
            let id_ext = match a.id_ext {
                Some(g) => g,
                None => guess_guid(dest, timeout)?,
            };
            spec(
                dest,
                id_ext,
                a.ioc_guid.unwrap_or(id_ext),
                a.options.as_deref(),
            )?
        }
        (None, None) => bail!("give --dest IP[:PORT] or --target STRING"),
    };
    let found = discover_luns(&target, timeout).map_err(|e| match e {
        SessionError::Login(l) if a.id_ext.is_none() && a.target.is_none() => anyhow::anyhow!(
            "{l}\n(the target port id was guessed from the target's MAC address; give --id-ext: \
             on a LIO target, /sys/module/ib_srpt/parameters/srpt_service_guid)"
        ),
        e => e.into(),
    })?;
    if a.json {
        let v: Vec<serde_json::Value> = found.iter().map(|f| json(&target, f)).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if found.is_empty() {
        eprintln!("{target}: the target maps no LUN for this initiator (check its ACL)");
    }
    for f in &found {
        println!("{}", line(&target, f));
    }
    Ok(())
}

/// One LUN: the target string with `lun=`, then a comment saying what it is.
fn line(target: &TargetSpec, f: &FoundLun) -> String {
    let t = TargetSpec {
        lun: Some(f.lun),
        ..target.clone()
    };
    match &f.info {
        Ok(i) => format!(
            "{t} # {} {} {} MiB{}{}",
            i.inquiry.vendor.trim(),
            i.inquiry.product.trim(),
            i.size() >> 20,
            i.wwid
                .as_ref()
                .map(|w| format!(" wwid={w}"))
                .unwrap_or_default(),
            if i.read_only { " read-only" } else { "" }
        ),
        Err(e) => format!("{t} # not a block device: {e}"),
    }
}

fn json(target: &TargetSpec, f: &FoundLun) -> serde_json::Value {
    let t = TargetSpec {
        lun: Some(f.lun),
        ..target.clone()
    };
    match &f.info {
        Ok(i) => serde_json::json!({
            "target": t.to_string(),
            "lun": f.lun,
            "vendor": i.inquiry.vendor.trim(),
            "product": i.inquiry.product.trim(),
            "size": i.size(),
            "block_size": i.capacity.block_len,
            "serial": i.serial,
            "wwid": i.wwid,
            "read_only": i.read_only,
        }),
        Err(e) => serde_json::json!({
            "target": t.to_string(),
            "lun": f.lun,
            "error": e.to_string(),
        }),
    }
}

/// The target port GUID LIO would use on soft-RoCE: the EUI-64 of the MAC behind `dest` (a local
/// interface, or the neighbour table once a first login attempt has resolved the address).
fn guess_guid(dest: SocketAddr, timeout: Duration) -> anyhow::Result<u64> {
    if let Some(mac) = neigh::mac_of(dest.ip()) {
        return Ok(neigh::eui64(mac));
    }
    // a login with a placeholder id resolves the address (and is refused); then look again
    let probe = spec(dest, 0, 0, None)?;
    let _ = discover_luns(&probe, timeout);
    match neigh::mac_of(dest.ip()) {
        Some(mac) => Ok(neigh::eui64(mac)),
        None => bail!(
            "cannot tell the target port id of {dest}: its MAC address is unknown (not a local \
             address, no neighbour entry); give --id-ext (on a LIO target: \
             /sys/module/ib_srpt/parameters/srpt_service_guid)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dest_and_guid_forms() {
        assert_eq!(
            parse_dest("10.77.0.1").unwrap(),
            "10.77.0.1:5555".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(
            parse_dest("10.77.0.1:4420").unwrap(),
            "10.77.0.1:4420".parse::<SocketAddr>().unwrap()
        );
        assert!(parse_dest("nowhere").is_err());
        assert_eq!(parse_guid("0x000000fffe770001"), Ok(0xfffe770001));
        assert_eq!(parse_guid("0000:00ff:fe77:0001"), Ok(0xfffe770001));
        assert!(parse_guid("xyz").is_err());
    }
}
