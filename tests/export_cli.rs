//! `srp-ublk resize --export` and `upgrade --export` against a real export (an NBD server of the
//! `mem:` backend): they refuse what they cannot do, saying why and what to do instead (an NBD
//! client reads the size when it connects, and a kernel client does not reconnect), and SIGHUP
//! and SIGUSR2 leave an NBD server serving, with a log line saying why.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn srp_ublk(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_srp-ublk"))
        .args(args)
        .env("SRP_UBLK_RUN_DIR", dir)
        .output()
        .unwrap()
}

fn refused(out: &Output, says: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "succeeded: {err}");
    assert!(err.contains(says), "the error does not say {says:?}: {err}");
}

/// Waits for `what` to hold, 10 s at most.
fn wait_for(what: &str, ok: impl Fn() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < Duration::from_secs(10), "no {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `serve --nbd` of a 1 MiB `mem:` disk named "disk", its run directory `dir`, its log `log`.
fn server(dir: &Path, log: &Path) -> Child {
    let sock = dir.join("nbd.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_srp-ublk"))
        .args(["serve", "--backend", "mem:1M", "--name", "disk", "--nbd"])
        .arg(format!("unix:{}", sock.display()))
        .env("SRP_UBLK_RUN_DIR", dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("srp-ublk serve starts");
    let state = dir.join(format!("exports/{}.json", child.id()));
    wait_for("state file", || state.exists());
    child
}

#[test]
fn resize_and_upgrade_of_an_nbd_export_say_why_not_and_its_server_serves_on() {
    let dir = std::env::temp_dir().join(format!("srp-ublk-export-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("serve.log");
    let mut srv = server(&dir, &log);
    let r = srp_ublk(&dir, &["resize", "--export", "disk"]);
    refused(
        &r,
        "export 'disk' is nbd: an NBD client reads the size when it connects",
    );
    let u = srp_ublk(&dir, &["upgrade", "--export", "disk"]);
    refused(
        &u,
        "export 'disk' is nbd: its clients would lose their connection",
    );
    let n = srp_ublk(&dir, &["resize", "--export", "nosuch"]);
    refused(
        &n,
        "no running srp-ublk export named 'nosuch' (see `srp-ublk list`)",
    );
    let all = srp_ublk(&dir, &["upgrade", "--all"]);
    let err = String::from_utf8_lossy(&all.stderr);
    assert!(
        err.contains("export disk (nbd) is left as it is"),
        "upgrade --all: {err}"
    );
    // the signals themselves: logged, and the server serves on
    let pid = nix::unistd::Pid::from_raw(srv.id() as i32);
    let logged = |s: &str| std::fs::read_to_string(&log).unwrap().contains(s);
    nix::sys::signal::kill(pid, nix::sys::signal::SIGHUP).unwrap();
    wait_for("SIGHUP line", || {
        logged("SIGHUP: no capacity check: an NBD export has none")
    });
    nix::sys::signal::kill(pid, nix::sys::signal::SIGUSR2).unwrap();
    wait_for("SIGUSR2 line", || {
        logged("SIGUSR2: not re-executed: an NBD export's kernel clients cannot reconnect")
    });
    assert!(srv.try_wait().unwrap().is_none(), "the server ended");
    srv.kill().unwrap();
    let _ = srv.wait();
    let r = srp_ublk(&dir, &["resize", "--export", "disk"]);
    refused(&r, "no running srp-ublk export named 'disk'");
    let _ = std::fs::remove_dir_all(&dir);
}
