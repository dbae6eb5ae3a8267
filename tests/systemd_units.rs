//! The systemd units in systemd/ pass `systemd-analyze verify` (with ExecStart pointing at the binary
//! this build made, since verify checks that commands exist), with nothing printed: verify only
//! warns, exit status 0, about unknown keys and bad values, so any output is a failure. And their
//! sandbox: `systemd-analyze security --offline=true` rates each at most 4.0 (issue 19; rdma-core's
//! srp_daemon_port@.service rates 7.4).

use std::path::Path;
use std::process::Command;

#[test]
fn units_verify_cleanly() {
    let out = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .expect("systemd-analyze is not installed: apt-get install systemd (or run `just deps`)");
    assert!(out.status.success());
    let bin = env!("CARGO_BIN_EXE_srp-ublk");
    let dir = std::env::temp_dir().join(format!("srp-ublk-units-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut units = Vec::new();
    for (file, instance) in [
        ("srp-ublk@.service", "srp-ublk@lab.service"),
        ("srp-ublk-port@.service", "srp-ublk-port@rxe0.service"),
        ("srp-ublk-serve@.service", "srp-ublk-serve@vm0.service"),
    ] {
        let text = std::fs::read_to_string(root.join("systemd").join(file)).unwrap();
        assert!(
            text.contains("/usr/sbin/srp-ublk "),
            "{file}: ExecStart is not /usr/sbin/srp-ublk"
        );
        let p = dir.join(instance);
        std::fs::write(&p, text.replace("/usr/sbin/srp-ublk", bin)).unwrap();
        units.push(p);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    for u in &units {
        let sec = Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(u)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&sec.stdout);
        let level: f64 = text
            .lines()
            .find_map(|l| {
                l.split_once("Overall exposure level for ")?
                    .1
                    .split_once(": ")
            })
            .and_then(|(_, v)| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no exposure level for {}:\n{text}", u.display()));
        eprintln!("{}: exposure {level}", u.display());
        assert!(
            level <= 4.0,
            "{} is exposed {level} (at most 4.0):\n{text}",
            u.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{stderr}"
    );
    assert!(
        stderr.trim().is_empty(),
        "systemd-analyze verify complained:\n{stderr}"
    );
}
