//! The manual from the clap definitions, so that it says what the binary takes: man pages
//! (`srp-ublk man DIR`, hidden: packaging runs it) with srp-ublk(8) and one page per subcommand,
//! and shell completions (`srp-ublk completions SHELL`).

use clap::{Args, Command, CommandFactory};
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;
use std::path::PathBuf;

/// `srp-ublk completions SHELL`
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    pub shell: clap_complete::Shell,
}

/// `srp-ublk man DIR`
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Where to write srp-ublk.8 and srp-ublk-SUBCOMMAND.8 (created if missing).
    pub dir: PathBuf,
}

/// Prints the completion script for a shell.
pub fn completions(a: CompletionsArgs) -> anyhow::Result<()> {
    use std::io::Write;
    std::io::stdout()
        .write_all(completion_script(a.shell).as_bytes())
        .map_err(|e| anyhow::anyhow!("cannot write the completion script: {e}"))
}

/// The completion script for `shell`, rendered in memory (clap_complete panics on a write error).
fn completion_script(shell: clap_complete::Shell) -> String {
    let mut cmd = super::Cli::command();
    let mut b = Vec::new();
    clap_complete::generate(shell, &mut cmd, "srp-ublk", &mut b);
    let script = String::from_utf8_lossy(&b).into_owned();
    // clap_complete 4.6 names a hyphenated binary's subcommand states two ways in bash (the
    // parser sets srp__ublk__subcmd__add, the option table matches srp__subcmd__ublk__subcmd__add),
    // so no subcommand's options would complete: one spelling
    match shell {
        clap_complete::Shell::Bash => script.replace("srp__subcmd__ublk", "srp__ublk"),
        _ => script,
    }
}

/// Writes every page into the directory.
pub fn man(a: ManArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.dir)?;
    for (name, page) in pages()? {
        let path = a.dir.join(format!("{name}.8"));
        std::fs::write(&path, page)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// The files srp-ublk reads and writes (srp-ublk(8)'s FILES).
const FILES: &[(&str, &str)] = &[
    (
        "/etc/srp-ublk/targets.d/NAME.conf",
        "one target a file, for `srp-ublk up` and srp-ublk@NAME.service",
    ),
    (
        "/run/srp-ublk/ublkbN.json",
        "the state of /dev/ublkbN (its daemon, target, LUN and geometry): what list, del, \
         recover and upgrade read",
    ),
    (
        "/run/srp-ublk/exports/PID.json",
        "the state of an export served by `srp-ublk serve` (process PID): what list and stats read",
    ),
    (
        "/run/srp-ublk/logs/",
        "the log of each daemon started by add (under systemd: the unit's journal instead)",
    ),
    (
        "/run/srp-ublk/NAME.sock",
        "the default socket of `srp-ublk serve --nbd` for export NAME",
    ),
    (
        "/etc/srp_daemon.conf",
        "srp_daemon's rules, as `discover --ib --rules` and `target rules` read them",
    ),
];

/// Examples per page, by page name: every subcommand needs its own (a test checks).
const EXAMPLES: &[(&str, &[(&str, &str)])] = &[
    (
        "srp-ublk",
        &[
            (
                "Attach a target's LUN 0 as a block device:",
                "srp-ublk add --target \"id_ext=000000fffe770001,ioc_guid=000000fffe770001,dest=10.77.0.1:5555\"",
            ),
            ("See what runs:", "srp-ublk list"),
            ("Detach it:", "srp-ublk del -n 0"),
        ],
    ),
    (
        "srp-ublk-add",
        &[
            (
                "Log in over RDMA/CM and create /dev/ublkbN for LUN 0:",
                "srp-ublk add --target \"id_ext=000000fffe770001,ioc_guid=000000fffe770001,dest=10.77.0.1:5555\"",
            ),
            (
                "One device per LUN the target reports, all over the port's 4 channels:",
                "srp-ublk add --target \"$T\" --lun all --queues 4",
            ),
            (
                "With dm-multipath's timers (fail I/O after 5 s down):",
                "srp-ublk add --target \"$T\" --fast-io-fail-tmo 5 --dev-loss-tmo 600",
            ),
        ],
    ),
    (
        "srp-ublk-discover",
        &[
            (
                "The LUNs of an RDMA/CM target, one add-ready string each:",
                "srp-ublk discover --dest 10.77.0.1",
            ),
            (
                "InfiniBand: every SRP target the subnet manager knows (srp_daemon -o style):",
                "srp-ublk discover --ib",
            ),
        ],
    ),
    (
        "srp-ublk-del",
        &[
            ("Remove /dev/ublkb0:", "srp-ublk del -n 0"),
            ("Remove every srp-ublk device:", "srp-ublk del --all"),
        ],
    ),
    (
        "srp-ublk-list",
        &[
            (
                "Devices and exports, targets, channels and credits:",
                "srp-ublk list",
            ),
            (
                "The same for scripts (an object: devices, exports):",
                "srp-ublk list --json",
            ),
        ],
    ),
    (
        "srp-ublk-recover",
        &[
            (
                "After a daemon crashed: log in again and resume /dev/ublkb0:",
                "srp-ublk recover -n 0",
            ),
            ("Every device whose daemon is gone:", "srp-ublk recover --all"),
        ],
    ),
    (
        "srp-ublk-resize",
        &[
            ("After the LUN grew on the target:", "srp-ublk resize -n 0"),
            (
                "The same for a vhost-user-blk export; its VM's guest sees the disk grow:",
                "srp-ublk resize --export vm0",
            ),
        ],
    ),
    (
        "srp-ublk-stats",
        &[
            (
                "Rates and latencies of every device and export:",
                "srp-ublk stats",
            ),
            (
                "One export's, over 10 s, for scripts:",
                "srp-ublk stats --export vm7 --interval 10 --json",
            ),
            (
                "For node_exporter's textfile collector:",
                "srp-ublk stats --prometheus /var/lib/prometheus/node-exporter/srp-ublk.prom",
            ),
        ],
    ),
    (
        "srp-ublk-serve",
        &[
            (
                "An NBD export for a VM, on a unix socket:",
                "srp-ublk serve --nbd unix:/run/srp-ublk/vm0.sock --name vm0 --target \"$T\"",
            ),
            (
                "A vhost-user-blk disk for a VM (QEMU's vhost-user-blk-pci, guest memory shared):",
                "srp-ublk serve --vhost-user-blk /run/srp-ublk/vm1.sock --name vm1 --target \"$T\"",
            ),
            (
                "The export /etc/srp-ublk/exports.d/vm0.conf describes (what srp-ublk-serve@vm0 runs):",
                "srp-ublk serve --config vm0",
            ),
            (
                "A RAM disk to measure a client against (not storage):",
                "srp-ublk serve --backend mem:1G --name test",
            ),
        ],
    ),
    (
        "srp-ublk-features",
        &[(
            "What this host offers (ublk, RDMA devices, modules):",
            "srp-ublk features",
        )],
    ),
    (
        "srp-ublk-up",
        &[
            (
                "Attach every target in /etc/srp-ublk/targets.d:",
                "srp-ublk up",
            ),
            ("Only targets.d/array1.conf:", "srp-ublk up array1"),
        ],
    ),
    (
        "srp-ublk-down",
        &[(
            "Detach the devices of targets.d/array1.conf:",
            "srp-ublk down array1",
        )],
    ),
    (
        "srp-ublk-upgrade",
        &[(
            "After installing a new package: every daemon re-executes it, devices kept:",
            "srp-ublk upgrade --all",
        )],
    ),
    (
        "srp-ublk-udev-id",
        &[(
            "The properties udev gives /dev/ublkb0 (by-id names):",
            "srp-ublk udev-id /dev/ublkb0",
        )],
    ),
    (
        "srp-ublk-target",
        &[(
            "How srp-ublk reads a target string:",
            "srp-ublk target parse \"id_ext=000000fffe770001,ioc_guid=000000fffe770001,dest=10.77.0.1:5555\"",
        )],
    ),
    (
        "srp-ublk-target-parse",
        &[(
            "Check a string before putting it in targets.d:",
            "srp-ublk target parse \"$(srp_daemon -o -n -i mlx5_0 -p 1 | head -1)\"",
        )],
    ),
    (
        "srp-ublk-target-rules",
        &[(
            "Which srp_daemon.conf rule each target matches, and its options:",
            "srp-ublk target rules /etc/srp_daemon.conf \"$(srp_daemon -o -n -i mlx5_0 -p 1)\"",
        )],
    ),
    (
        "srp-ublk-completions",
        &[(
            "Bash completion for this shell:",
            "source <(srp-ublk completions bash)",
        )],
    ),
];

/// Every page: (name, roff). srp-ublk(8), then one per subcommand at every level.
fn pages() -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut cmd = super::Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    page(&cmd, true, &mut out)?;
    Ok(out)
}

fn page(cmd: &Command, top: bool, out: &mut Vec<(String, Vec<u8>)>) -> anyhow::Result<()> {
    let name = cmd.get_display_name().unwrap_or(cmd.get_name()).to_string();
    let mut b = Vec::new();
    let man = Man::new(cmd.clone())
        .section("8")
        .manual("System Administration")
        .source(format!("srp-ublk {}", env!("CARGO_PKG_VERSION")));
    man.render(&mut b)?;
    let mut r = Roff::new();
    // what follows is left-adjusted: paths and commands are not to be spread over the line
    r.control("ad", ["l"]);
    if top {
        let mut statuses = vec![("0".to_string(), "success")];
        statuses.extend(
            super::status::Exit::ALL
                .iter()
                .map(|(e, text)| ((*e as u8).to_string(), *text)),
        );
        let statuses: Vec<(&str, &str)> = statuses.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        definitions(&mut r, "EXIT STATUS", &statuses);
        definitions(&mut r, "FILES", FILES);
    }
    let Some((_, examples)) = EXAMPLES.iter().find(|(n, _)| *n == name) else {
        anyhow::bail!("no EXAMPLES for the page {name}: add them to cli::manual::EXAMPLES");
    };
    r.control("SH", ["EXAMPLES"]);
    for (what, how) in examples.iter() {
        r.control("PP", []).text([roman(*what)]);
        r.control("RS", []).control("nf", []).text([bold(*how)]);
        r.control("fi", []).control("RE", []);
    }
    r.control("SH", ["SEE ALSO"]);
    let see = if top {
        "srp_daemon(1), multipath(8), nbd-client(8), qemu(1); /usr/share/doc/srp-ublk/"
    } else {
        "srp-ublk(8)"
    };
    r.text([roman(see)]);
    b.extend_from_slice(r.to_roff().as_bytes());
    out.push((name, b));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        page(sub, false, out)?;
    }
    Ok(())
}

/// A section of tagged paragraphs: each term in bold, then what it means.
fn definitions(r: &mut Roff, title: &str, items: &[(&str, &str)]) {
    r.control("SH", [title]);
    for (term, text) in items {
        r.control("TP", []).text([bold(*term)]).text([roman(*text)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subcommand_has_a_page_with_its_examples() {
        let pages = pages().expect("every page renders");
        let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
        let mut cmd = crate::cli::Cli::command().disable_help_subcommand(true);
        cmd.build();
        let mut want = vec!["srp-ublk".to_string()];
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            want.push(format!("srp-ublk-{}", sub.get_name()));
            for s in sub.get_subcommands().filter(|s| !s.is_hide_set()) {
                want.push(format!("srp-ublk-{}-{}", sub.get_name(), s.get_name()));
            }
        }
        for w in &want {
            assert!(names.contains(&w.as_str()), "no page {w}: {names:?}");
        }
        for (name, page) in &pages {
            let text = String::from_utf8_lossy(page);
            for section in ["NAME", "SYNOPSIS", "EXAMPLES", "\"SEE ALSO\""] {
                assert!(
                    text.contains(&format!(".SH {section}")),
                    "{name}: no {section}"
                );
            }
        }
        let top = String::from_utf8_lossy(&pages[0].1);
        assert!(top.contains(".SH FILES") && top.contains(".SH \"EXIT STATUS\""));
        assert!(
            top.contains("/etc/srp\\-ublk/targets.d"),
            "FILES names targets.d"
        );
        assert!(
            !names.contains(&"srp-ublk-man"),
            "the hidden man command has no page"
        );
    }

    /// What bash offers for `words` (the last one being completed).
    fn bash_complete(words: &[&str]) -> String {
        let dir = std::env::temp_dir().join(format!("srp-ublk-compl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let f = dir.join(words.join("-"));
        std::fs::write(&f, completion_script(clap_complete::Shell::Bash)).expect("script");
        let n = words.len() - 1;
        let line = words.join(" ");
        let sh = format!(
            "source {}; COMP_WORDS=({line}); COMP_CWORD={n}; COMP_LINE='{line}'; \
             COMP_POINT={}; _srp__ublk srp-ublk '{}' '{}'; echo \"${{COMPREPLY[*]}}\"",
            f.display(),
            line.len(),
            words[n],
            words[n - 1]
        );
        let out = std::process::Command::new("bash")
            .args(["-c", &sh])
            .output();
        let _ = std::fs::remove_file(&f);
        String::from_utf8_lossy(&out.expect("bash runs").stdout)
            .trim()
            .to_string()
    }

    #[test]
    fn bash_completes_subcommands_and_their_options() {
        assert_eq!(bash_complete(&["srp-ublk", "ad"]), "add");
        assert_eq!(
            bash_complete(&["srp-ublk", "add", "--rkey"]),
            "--rkey-scope"
        );
        assert_eq!(bash_complete(&["srp-ublk", "target", "pa"]), "parse");
    }
}
