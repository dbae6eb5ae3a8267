//! `srp-ublk features`: what this host offers: the ublk driver and its features, RDMA devices, ports and
//! GIDs, and the kernel modules involved.

use std::path::Path;

fn read(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Runs `features`.
pub fn run() -> anyhow::Result<()> {
    println!(
        "kernel: {}",
        read("/proc/sys/kernel/osrelease").unwrap_or_default()
    );
    ublk();
    modules();
    rdma_devices();
    println!(
        "/dev/infiniband/rdma_cm: {}",
        if Path::new("/dev/infiniband/rdma_cm").exists() {
            "present"
        } else {
            "missing (modprobe rdma_ucm)"
        }
    );
    Ok(())
}

/// ublk's control device and the driver's features.
fn ublk() {
    if Path::new("/dev/ublk-control").exists() {
        match libublk::ctrl::UblkCtrl::get_features() {
            Some(f) => {
                let has = |flag: u32| f & u64::from(flag) != 0;
                println!(
                    "ublk: /dev/ublk-control present, driver features {f:#x} (live resize: {}; \
                     batch I/O commands: {})",
                    if has(libublk::sys::UBLK_F_UPDATE_SIZE) {
                        "yes"
                    } else {
                        "no, UPDATE_SIZE needs Linux 6.16"
                    },
                    if has(libublk::sys::UBLK_F_BATCH_IO) {
                        "yes"
                    } else {
                        "no"
                    }
                )
            }
            None => println!("ublk: /dev/ublk-control present, driver features unknown"),
        }
    } else {
        println!("ublk: MISSING /dev/ublk-control (modprobe ublk_drv)");
    }
}

/// Whether each module srp-ublk or the lab needs is loaded.
fn modules() {
    for m in [
        "ublk_drv",
        "rdma_rxe",
        "rdma_ucm",
        "ib_uverbs",
        "ib_srp",
        "ib_srpt",
    ] {
        let loaded = Path::new(&format!("/sys/module/{m}")).exists();
        println!(
            "module {m}: {}",
            if loaded { "loaded" } else { "not loaded" }
        );
    }
}

/// Each RDMA device, its ports' state, link layer and GIDs.
fn rdma_devices() {
    let mut any = false;
    for dev in std::fs::read_dir("/sys/class/infiniband")
        .into_iter()
        .flatten()
        .flatten()
    {
        any = true;
        let name = dev.file_name().to_string_lossy().into_owned();
        let guid = read(dev.path().join("node_guid")).unwrap_or_default();
        println!("rdma device {name}: node_guid {guid}");
        for port in std::fs::read_dir(dev.path().join("ports"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let p = port.path();
            let state = read(p.join("state")).unwrap_or_default();
            let ll = read(p.join("link_layer")).unwrap_or_default();
            println!(
                "  port {}: {state}, {ll}",
                port.file_name().to_string_lossy()
            );
            for i in 0..4 {
                match read(p.join(format!("gids/{i}"))) {
                    Some(g) if g != "0000:0000:0000:0000:0000:0000:0000:0000" => {
                        println!("    gid{i} {g}")
                    }
                    _ => {}
                }
            }
        }
    }
    if !any {
        println!(
            "rdma: no RDMA devices (add soft-RoCE with `rdma link add rxe0 type rxe netdev IFACE`)"
        );
    }
}
