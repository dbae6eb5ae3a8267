//! `srp-ublk features`: what this host offers: the ublk driver and its features, RDMA devices, ports and
//! GIDs, and the kernel modules involved; as text or JSON.

use clap::Args;
use serde::Serialize;
use std::path::Path;

/// `srp-ublk features ...`
#[derive(Debug, Args)]
pub struct FeaturesArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// What the host has.
#[derive(Debug, Serialize)]
struct Features {
    kernel: String,
    ublk: Ublk,
    modules: Vec<Module>,
    rdma_devices: Vec<RdmaDevice>,
    rdma_cm: bool,
}

/// ublk's control device and the driver's features.
#[derive(Debug, Serialize)]
struct Ublk {
    control: bool,
    /// UBLK_F_* the driver offers (None: the control device is missing or did not say).
    features: Option<u64>,
    live_resize: bool,
    batch_io: bool,
}

#[derive(Debug, Serialize)]
struct Module {
    name: &'static str,
    loaded: bool,
}

#[derive(Debug, Serialize)]
struct RdmaDevice {
    name: String,
    node_guid: String,
    ports: Vec<Port>,
}

#[derive(Debug, Serialize)]
struct Port {
    port: String,
    state: String,
    link_layer: String,
    /// Which of the first four GIDs are set, with their index (RoCE v2's IPv4 GID is often 1).
    gids: Vec<Gid>,
}

#[derive(Debug, Serialize)]
struct Gid {
    index: u8,
    gid: String,
}

/// The modules srp-ublk, and the lab's target and reference initiator, use.
const MODULES: [&str; 6] = [
    "ublk_drv",
    "rdma_rxe",
    "rdma_ucm",
    "ib_uverbs",
    "ib_srp",
    "ib_srpt",
];

fn read(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Runs `features`.
pub fn run(a: FeaturesArgs) -> anyhow::Result<()> {
    let f = collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&f)?);
    } else {
        print_text(&f);
    }
    Ok(())
}

fn collect() -> Features {
    Features {
        kernel: read("/proc/sys/kernel/osrelease").unwrap_or_default(),
        ublk: ublk(),
        modules: MODULES
            .iter()
            .map(|&name| Module {
                name,
                loaded: Path::new(&format!("/sys/module/{name}")).exists(),
            })
            .collect(),
        rdma_devices: rdma_devices(),
        rdma_cm: Path::new("/dev/infiniband/rdma_cm").exists(),
    }
}

fn ublk() -> Ublk {
    let control = Path::new("/dev/ublk-control").exists();
    let features = if control {
        libublk::ctrl::UblkCtrl::get_features()
    } else {
        None
    };
    let has = |flag: u32| features.is_some_and(|f| f & u64::from(flag) != 0);
    Ublk {
        control,
        features,
        live_resize: has(libublk::sys::UBLK_F_UPDATE_SIZE),
        batch_io: has(libublk::sys::UBLK_F_BATCH_IO),
    }
}

fn entries(dir: impl AsRef<Path>) -> Vec<std::fs::DirEntry> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .collect();
    v.sort_by_key(|e| e.file_name());
    v
}

fn rdma_devices() -> Vec<RdmaDevice> {
    entries("/sys/class/infiniband")
        .into_iter()
        .map(|dev| RdmaDevice {
            name: dev.file_name().to_string_lossy().into_owned(),
            node_guid: read(dev.path().join("node_guid")).unwrap_or_default(),
            ports: entries(dev.path().join("ports"))
                .into_iter()
                .map(|port| {
                    let p = port.path();
                    Port {
                        port: port.file_name().to_string_lossy().into_owned(),
                        state: read(p.join("state")).unwrap_or_default(),
                        link_layer: read(p.join("link_layer")).unwrap_or_default(),
                        gids: (0..4u8)
                            .filter_map(|index| {
                                let gid = read(p.join(format!("gids/{index}")))?;
                                let set = gid != "0000:0000:0000:0000:0000:0000:0000:0000";
                                set.then_some(Gid { index, gid })
                            })
                            .collect(),
                    }
                })
                .collect(),
        })
        .collect()
}

fn print_text(f: &Features) {
    println!("kernel: {}", f.kernel);
    match (&f.ublk, f.ublk.features) {
        (u, Some(bits)) => println!(
            "ublk: /dev/ublk-control present, driver features {bits:#x} (live resize: {}; batch \
             I/O commands: {})",
            if u.live_resize {
                "yes"
            } else {
                "no, UPDATE_SIZE needs Linux 6.16"
            },
            if u.batch_io { "yes" } else { "no" }
        ),
        (u, None) if u.control => {
            println!("ublk: /dev/ublk-control present, driver features unknown")
        }
        _ => println!("ublk: MISSING /dev/ublk-control (modprobe ublk_drv)"),
    }
    for m in &f.modules {
        let state = if m.loaded { "loaded" } else { "not loaded" };
        println!("module {}: {state}", m.name);
    }
    for d in &f.rdma_devices {
        println!("rdma device {}: node_guid {}", d.name, d.node_guid);
        for p in &d.ports {
            println!("  port {}: {}, {}", p.port, p.state, p.link_layer);
            for g in &p.gids {
                println!("    gid{} {}", g.index, g.gid);
            }
        }
    }
    if f.rdma_devices.is_empty() {
        println!(
            "rdma: no RDMA devices (add soft-RoCE with `rdma link add rxe0 type rxe netdev IFACE`)"
        );
    }
    println!(
        "/dev/infiniband/rdma_cm: {}",
        if f.rdma_cm {
            "present"
        } else {
            "missing (modprobe rdma_ucm)"
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_names_every_part_the_text_shows() {
        let v = serde_json::to_value(collect()).unwrap();
        for key in ["kernel", "ublk", "modules", "rdma_devices", "rdma_cm"] {
            assert!(v.get(key).is_some(), "no {key} in {v}");
        }
        assert_eq!(v["modules"].as_array().unwrap().len(), MODULES.len());
        assert!(v["ublk"]["live_resize"].is_boolean());
    }
}
