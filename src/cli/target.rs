//! `srp-ublk target parse|rules`: check target strings the way ib_srp and srp_daemon read them.

use anyhow::Context;
use clap::Subcommand;
use srp_ublk::wire::target::{
    hex16, RkeyScope, Rules, TargetSpec, Transport, DEFAULT_INITIATOR_EXT,
};

/// `srp-ublk target ...`
#[derive(Debug, Subcommand)]
pub enum TargetCmd {
    /// Parse a target string and print its normalized form and the SRP port identifiers.
    Parse {
        /// An ib_srp add_target string or an `srp_daemon -o` line, e.g.
        /// "id_ext=000000fffe770001,ioc_guid=000000fffe770001,dest=10.77.0.1:5555".
        target: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Apply an srp_daemon.conf-style rules file to target strings (one per argument or stdin line).
    Rules {
        /// The rules file (srp_daemon.conf syntax).
        file: std::path::PathBuf,
        /// Target strings; read from stdin, one per line, when none are given.
        targets: Vec<String>,
    },
}

/// Runs `srp-ublk target ...`.
pub fn run(cmd: TargetCmd) -> anyhow::Result<()> {
    match cmd {
        TargetCmd::Parse { target, json } => {
            let t = TargetSpec::parse(&target)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&describe_json(&t))?);
            } else {
                print!("{}", describe(&t));
            }
            Ok(())
        }
        TargetCmd::Rules { file, targets } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read rules file {}", file.display()))?;
            let rules = Rules::parse(&text).with_context(|| format!("in {}", file.display()))?;
            let lines: Vec<String> = if targets.is_empty() {
                std::io::stdin().lines().collect::<Result<_, _>>()?
            } else {
                targets
            };
            for line in lines.iter().filter(|l| !l.trim().is_empty()) {
                let t = TargetSpec::parse(line)?;
                match rules.apply(&t)? {
                    Some(t) => println!("{t}"),
                    None => eprintln!("disallowed by {}: {t}", file.display()),
                }
            }
            Ok(())
        }
    }
}

/// The human-readable description `target parse` prints.
pub fn describe(t: &TargetSpec) -> String {
    let mut s = format!("normalized: {t}\n");
    match t.transport {
        Transport::RdmaCm { dest, src, dest_if } => {
            s += "transport: RDMA/CM (RDMA_PS_TCP)\n";
            s += &format!("dest: {dest}\n");
            if let Some(n) = dest_if {
                s += &format!("dest scope: interface {n} (its index is looked up at login)\n");
            }
            if let Some(src) = src {
                s += &format!("src: {src}\n");
            }
        }
        Transport::IbCm {
            pkey,
            service_id,
            dgid,
        } => {
            s += "transport: IB CM (needs an InfiniBand fabric)\n";
            s += &format!(
                "dgid: {}\npkey: {pkey:04x}\nservice_id: {service_id:016x}\n",
                hex16(&dgid)
            );
        }
    }
    let ext = t.opts.initiator_ext.unwrap_or(DEFAULT_INITIATOR_EXT);
    let src = if t.opts.initiator_ext.is_some() {
        "from the target string"
    } else {
        "srp-ublk default"
    };
    s += &format!("target_port_id: {}\n", hex16(&t.target_port_id()));
    s += &format!("initiator_ext: {ext:016x} ({src})\n");
    s += "initiator_port_id: initiator_ext || local port GUID (interface id of GID 0)\n";
    let scope = match t.opts.rkey_scope {
        Some(r) => format!("{r} (from the target string or --rkey-scope)"),
        None => format!("{} (srp-ublk default)", RkeyScope::default()),
    };
    s += &format!("rkey_scope: {scope}\n");
    s
}

/// `target parse --json`: what [`describe`] says, as an object.
pub fn describe_json(t: &TargetSpec) -> serde_json::Value {
    let mut j = serde_json::json!({
        "normalized": t.to_string(),
        "target_port_id": hex16(&t.target_port_id()),
        "initiator_ext": format!("{:016x}", t.opts.initiator_ext.unwrap_or(DEFAULT_INITIATOR_EXT)),
        "initiator_ext_given": t.opts.initiator_ext.is_some(),
        "rkey_scope": t.opts.rkey_scope.unwrap_or_default().to_string(),
        "rkey_scope_given": t.opts.rkey_scope.is_some(),
    });
    let transport = match t.transport {
        Transport::RdmaCm { dest, src, dest_if } => serde_json::json!({
            "transport": "rdma_cm",
            "dest": dest.to_string(),
            "src": src.map(|s| s.to_string()),
            "dest_if": dest_if.map(|n| n.to_string()),
        }),
        Transport::IbCm {
            pkey,
            service_id,
            dgid,
        } => serde_json::json!({
            "transport": "ib_cm",
            "dgid": hex16(&dgid),
            "pkey": format!("{pkey:04x}"),
            "service_id": format!("{service_id:016x}"),
        }),
    };
    if let (Some(o), serde_json::Value::Object(t)) = (j.as_object_mut(), transport) {
        o.extend(t);
    }
    j
}
