//! The srp-ublk binary: parse the command line, install logging, run, map errors to exit codes.

mod cli;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = cli::Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // colours only on a terminal: the daemon's log file and the journal get plain text
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    // a daemon started by `add` logs to its file, bounded (stderr, the same file, keeps what
    // else a process writes there)
    let file = std::env::var_os(cli::spawn::LOG_ENV)
        .filter(|_| std::env::var_os(cli::spawn::DAEMON_ENV).is_some())
        .and_then(|p| cli::logfile::CappedLog::open(p.into(), cli::logfile::MAX_LOG_BYTES).ok());
    // each line names the device its daemon serves; to the journal, with its syslog priority
    use cli::logging::Tagged;
    match file {
        Some(log) => fmt
            .with_writer(Tagged::new(move || log.clone(), false))
            .init(),
        // the journal stamps each line itself
        None if cli::logging::stderr_is_journal() => fmt
            .without_time()
            .with_writer(Tagged::new(std::io::stderr, true))
            .init(),
        None => fmt.with_writer(Tagged::new(std::io::stderr, false)).init(),
    }
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("srp-ublk: error: {e:#}");
            ExitCode::from(cli::status::exit_of(&e) as u8)
        }
    }
}

/// `srp-ublk list | head -1`: Rust ignores SIGPIPE, so printing to a pipe whose reader left
/// panics in `println!`; end as a program that kept SIGPIPE's default would, quietly with the
/// shell's status for it (128 + 13), instead of a panic message.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(128 + 13);
        }
        default(info);
    }));
}
