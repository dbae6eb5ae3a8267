//! srp-ublk's configuration files (`targets.d/NAME.conf` for `up`, `exports.d/NAME.conf` for
//! `serve --config`): `key = value` lines with the command's long option names (`-` or `_`), `#`
//! comments; read into the command line they stand for, which the command's own parser then
//! checks as it checks typed options.

use anyhow::bail;
use std::path::{Path, PathBuf};

/// Where target files live (`SRP_UBLK_CONF_DIR` overrides it, for tests).
pub fn targets_dir() -> PathBuf {
    std::env::var_os("SRP_UBLK_CONF_DIR")
        .map_or_else(|| PathBuf::from("/etc/srp-ublk/targets.d"), PathBuf::from)
}

/// Where export files live (`SRP_UBLK_EXPORTS_DIR` overrides it, for tests).
pub fn exports_dir() -> PathBuf {
    std::env::var_os("SRP_UBLK_EXPORTS_DIR")
        .map_or_else(|| PathBuf::from("/etc/srp-ublk/exports.d"), PathBuf::from)
}

/// What a kind of file may say.
pub struct Keys<'a> {
    /// Options that take a value.
    pub values: &'a [&'a str],
    /// Options that are on or off (`yes`/`no`, `true`/`false`, `1`/`0`).
    pub flags: &'a [&'a str],
    /// The option every file must set.
    pub required: &'a str,
}

/// The command-line arguments a file's `text` stands for (`file` names it in messages).
pub fn argv(text: &str, file: &Path, keys: &Keys) -> anyhow::Result<Vec<String>> {
    let mut argv = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split_once('#').map_or(raw, |(a, _)| a).trim();
        if line.is_empty() {
            continue;
        }
        let at = format!("{}:{}", file.display(), i + 1);
        let Some((k, v)) = line.split_once('=') else {
            bail!("{at}: expected key = value, got '{line}'");
        };
        let (k, v) = (k.trim().replace('_', "-"), v.trim());
        if keys.flags.contains(&k.as_str()) {
            match v {
                "yes" | "true" | "1" => argv.push(format!("--{k}")),
                "no" | "false" | "0" => {}
                _ => bail!("{at}: {k} = {v}: expected yes or no"),
            }
        } else if keys.values.contains(&k.as_str()) {
            argv.push(format!("--{k}"));
            argv.push(v.to_string());
        } else {
            let known: Vec<&str> = keys.values.iter().chain(keys.flags).copied().collect();
            bail!("{at}: unknown key '{k}' (known: {})", known.join(", "));
        }
    }
    if !argv.iter().any(|a| *a == format!("--{}", keys.required)) {
        bail!("{}: no {} = ... line", file.display(), keys.required);
    }
    Ok(argv)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: Keys = Keys {
        values: &["target", "nbd"],
        flags: &["no-tls"],
        required: "target",
    };

    #[test]
    fn flags_are_on_or_off_and_values_are_passed_on() {
        let f = Path::new("e.conf");
        let got = argv(
            "target = t # the LUN\nno_tls = yes\nnbd=tcp:[::]:10809\n",
            f,
            &KEYS,
        );
        assert_eq!(
            got.unwrap(),
            ["--target", "t", "--no-tls", "--nbd", "tcp:[::]:10809"]
        );
        assert!(argv("target = t\nno-tls = no\n", f, &KEYS).unwrap().len() == 2);
        let e = argv("target = t\nno-tls = maybe\n", f, &KEYS).unwrap_err();
        assert_eq!(
            e.to_string(),
            "e.conf:2: no-tls = maybe: expected yes or no"
        );
        let e = argv("nbd = x\n", f, &KEYS).unwrap_err();
        assert_eq!(e.to_string(), "e.conf: no target = ... line");
    }
}
