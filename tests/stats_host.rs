//! `srp-ublk stats --prometheus`: every counter of a device's state file in the Prometheus text
//! format, parsed back by the Prometheus project's own Python parser (Debian's
//! python3-prometheus-client, which `just deps` installs, run by Debian's /usr/bin/python3) and
//! checked value by value.

use std::process::Command;

#[test]
fn prometheus_text_parses_and_carries_the_counters() {
    let dir = std::env::temp_dir().join(format!("srp-ublk-stats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut lat = vec![0u64; srp_ublk::stats::BUCKETS];
    let mut io = srp_ublk::stats::IoCounters::default();
    for us in [90u64, 100, 110, 2000, 3_000_000] {
        io.record(srp_ublk::stats::IoKind::Read, 4096, true, us);
        lat[srp_ublk::stats::bucket(us)] += 1;
    }
    io.record(srp_ublk::stats::IoKind::Write, 65536, false, 500);
    assert_eq!(io.lat.iter().sum::<u64>(), 6);
    let state = serde_json::json!({
        "dev_id": 7, "bdev": "/dev/ublkb7", "pid": 1, "target": "t", "lun": 2, "size": 1048576,
        "block_size": 512, "depth": 64, "poll": "adaptive", "vendor": "V", "product": "P",
        "serial": null, "wwid": null, "rdma_device": "rxe0", "log": "",
        "queues": [{"qid": 0, "tid": 1, "req_lim_login": 128, "req_lim": 128, "cmds": 6,
                    "credit_stalls": 3, "slot_stalls": 4, "buffer_stalls": 5, "state": "running",
                    "reconnects": 2, "aborts": 1,
                    "io": io}],
        "memory": {"domains": 1, "registrations": 4, "pinned_bytes": 25165824}
    });
    std::fs::write(dir.join("ublkb7.json"), state.to_string()).unwrap();
    // a vhost-user-blk export beside it, with a name a label must escape
    let export = serde_json::json!({
        "name": "vm\"7", "kind": "vhost-user-blk", "listen": "/run/vm7.sock", "pid": 1,
        "pid_start": 1, "updated_ms": 1, "target": "t", "lun": 3, "size": 1048576,
        "block_size": 512, "read_only": false, "vendor": "V", "product": "P", "wwid": null,
        "rdma_device": "rxe0", "depth": 64, "version": "v", "unit": null, "connections": 1,
        "connections_total": 4, "max_connections": 1,
        "queues": [{"qid": 0, "tid": 1, "req_lim_login": 128, "req_lim": 128, "cmds": 9,
                    "credit_stalls": 0, "state": "running", "io": io,
                    "zero_copy_bytes": 8192, "copied_bytes": 512}],
        "memory": null
    });
    std::fs::create_dir_all(dir.join("exports")).unwrap();
    std::fs::write(dir.join("exports/1.json"), export.to_string()).unwrap();
    let out = dir.join("srp-ublk.prom");
    let st = Command::new(env!("CARGO_BIN_EXE_srp-ublk"))
        .args(["stats", "--prometheus"])
        .arg(&out)
        .env("SRP_UBLK_RUN_DIR", &dir)
        .status()
        .unwrap();
    assert!(st.success());
    let py = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
text = open(sys.argv[1]).read()
for fam in text_string_to_metric_families(text):
    for s in fam.samples:
        print(f"{fam.type} {s.name} {s.labels.get('le', '-')} {float(s.value)}")
        if 'export' in s.labels and 'le' not in s.labels:
            print(f"export {s.labels['export']} {s.labels['lun']} {s.name} {float(s.value)}")
"#;
    let parsed = Command::new("/usr/bin/python3")
        .args(["-c", py])
        .arg(&out)
        .output()
        .expect("python3");
    let text = String::from_utf8_lossy(&parsed.stdout);
    assert!(
        parsed.status.success(),
        "the Prometheus parser failed (apt-get install python3-prometheus-client, or `just deps`): {}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    let want = [
        "counter srp_ublk_read_ops_total - 5.0",
        "counter srp_ublk_read_bytes_total - 20480.0",
        "counter srp_ublk_write_ops_total - 1.0",
        "counter srp_ublk_write_bytes_total - 65536.0",
        "counter srp_ublk_io_errors_total - 1.0",
        "counter srp_ublk_credit_stalls_total - 3.0",
        "counter srp_ublk_send_slot_stalls_total - 4.0",
        "counter srp_ublk_buffer_stalls_total - 5.0",
        "counter srp_ublk_reconnects_total - 2.0",
        "counter srp_ublk_aborts_total - 1.0",
        "gauge srp_ublk_queue_running - 0.0", // pid 1 is not this device's daemon
        "counter srp_ublk_protection_domains_total - 1.0",
        "counter srp_ublk_registrations_total - 4.0",
        "gauge srp_ublk_pinned_bytes - 25165824.0",
        "histogram srp_ublk_io_latency_seconds_bucket 0.000127 3.0", // 90, 100, 110 us
        "histogram srp_ublk_io_latency_seconds_bucket 0.000511 4.0", // and 500 us
        "histogram srp_ublk_io_latency_seconds_bucket 0.001023 4.0",
        "histogram srp_ublk_io_latency_seconds_bucket 0.002047 5.0", // and 2 ms
        "histogram srp_ublk_io_latency_seconds_bucket 2.097151 5.0",
        "histogram srp_ublk_io_latency_seconds_bucket +Inf 6.0", // and 3 s
        "histogram srp_ublk_io_latency_seconds_count - 6.0",
        "export vm\"7 3 srp_ublk_read_ops_total 5.0",
        "export vm\"7 3 srp_ublk_export_connections 1.0",
        "export vm\"7 3 srp_ublk_export_connections_total 4.0",
        "export vm\"7 3 srp_ublk_zero_copy_bytes_total 8192.0",
        "export vm\"7 3 srp_ublk_copied_bytes_total 512.0",
        "export vm\"7 3 srp_ublk_queue_running 0.0",
    ];
    for w in want {
        assert!(text.lines().any(|l| l == w), "missing '{w}' in:\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `srp-ublk stats`' text: the rates between two writes of the state file, with the stalls, reconnects
/// and aborts of that interval.
#[test]
fn text_rates_between_two_state_writes() {
    let dir = std::env::temp_dir().join(format!("srp-ublk-stats-text-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = |ms: u64, n: u64| {
        let mut io = srp_ublk::stats::IoCounters::default();
        for _ in 0..n {
            io.record(srp_ublk::stats::IoKind::Write, 4096, false, 100);
        }
        serde_json::json!({
            "dev_id": 3, "bdev": "/dev/ublkb3", "pid": 1, "target": "t", "lun": 0, "size": 1048576,
            "block_size": 512, "depth": 64, "poll": "adaptive", "vendor": "V", "product": "P",
            "serial": null, "wwid": null, "rdma_device": "rxe0", "log": "", "updated_ms": ms,
            "queues": [{"qid": 0, "tid": 1, "req_lim_login": 128, "req_lim": 128, "cmds": n,
                        "credit_stalls": n / 100, "slot_stalls": n / 10, "buffer_stalls": n / 4,
                        "state": "running",
                        "reconnects": 0, "aborts": 0, "io": io}]
        })
        .to_string()
    };
    let file = dir.join("ublkb3.json");
    std::fs::write(&file, state(10_000, 0)).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_srp-ublk"))
        .args(["stats", "-n", "3", "--interval", "0.2"])
        .env("SRP_UBLK_RUN_DIR", &dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // the daemon's next write, 2 s of counters later: 2000 writes, 20 credit, 200 slot and 500
    // buffer stalls
    std::thread::sleep(std::time::Duration::from_millis(600));
    std::fs::write(&file, state(12_000, 2000)).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "stats failed: {text}");
    for want in [
        "/dev/ublkb3  read 0 IOPS 0.0 MB/s  write 1000 IOPS 4.1 MB/s",
        "credit stalls 20  slot stalls 200  buffer stalls 500  reconnects 0  aborts 0",
        "    q0  read 0 IOPS",
    ] {
        assert!(text.contains(want), "missing '{want}' in:\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
