//! What a command that acts on one or several devices reports: a line per device done (or, with
//! `--json`, an array with an object per device), each failure on stderr, and the exit status the
//! outcomes add up to: the failure's own when the only device failed, 3 (partial) when some were
//! done, 1 when none was.

use super::status::{failed, Exit};
use serde_json::{json, Value};

/// The outcomes of one command, device by device.
pub struct Report {
    json: bool,
    rows: Vec<Value>,
    errors: Vec<(String, anyhow::Error)>,
}

impl Report {
    /// A report printed as JSON with `json`, as lines otherwise.
    pub fn new(json: bool) -> Report {
        Report {
            json,
            rows: Vec::new(),
            errors: Vec::new(),
        }
    }

    /// `device` done: `line` for people (none when empty), `detail` (an object) added to its
    /// JSON.
    pub fn done(&mut self, device: &str, line: String, detail: Value) {
        if !self.json && !line.is_empty() {
            println!("{line}");
        }
        let mut row = json!({"device": device, "ok": true});
        if let (Some(r), Value::Object(d)) = (row.as_object_mut(), detail) {
            r.extend(d);
        }
        self.rows.push(row);
    }

    /// `device` failed with `e` (whose message names the device).
    pub fn failed(&mut self, device: &str, e: anyhow::Error) {
        self.rows
            .push(json!({"device": device, "ok": false, "error": format!("{e:#}")}));
        self.errors.push((device.to_string(), e));
    }

    /// Prints the JSON (with `--json`) and the failures; the command's result, `verb` saying what
    /// was not done to the devices that failed ("deleted").
    pub fn finish(mut self, verb: &str) -> anyhow::Result<()> {
        if self.json {
            let text = serde_json::to_string_pretty(&self.rows).unwrap_or_default();
            println!("{text}");
        }
        let done = self.rows.len() - self.errors.len();
        if self.errors.len() == 1 && done == 0 {
            // the only device: its own error, with its exit status
            let (_, e) = self.errors.remove(0);
            return Err(e);
        }
        if self.errors.is_empty() {
            return Ok(());
        }
        for (_, e) in &self.errors {
            eprintln!("srp-ublk: error: {e:#}");
        }
        let names: Vec<&str> = self.errors.iter().map(|(d, _)| d.as_str()).collect();
        let exit = if done > 0 {
            Exit::Partial
        } else {
            Exit::Failure
        };
        Err(failed(
            exit,
            format!(
                "{} device(s) not {verb}: {} ({done} {verb})",
                names.len(),
                names.join(", ")
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_add_up_to_the_exit_status() {
        let mut one = Report::new(true);
        let refused = failed(Exit::Refused, "the target refused");
        one.failed("/dev/ublkb0", refused);
        let e = one.finish("recovered").unwrap_err();
        assert_eq!(super::super::status::exit_of(&e), Exit::Refused);
        let mut some = Report::new(true);
        some.done("/dev/ublkb0", String::new(), json!({"pid": 7}));
        some.failed("/dev/ublkb1", anyhow::anyhow!("still open"));
        assert_eq!(
            some.rows[0],
            json!({"device": "/dev/ublkb0", "ok": true, "pid": 7})
        );
        assert_eq!(some.rows[1]["error"], "still open");
        let e = some.finish("deleted").unwrap_err();
        assert_eq!(super::super::status::exit_of(&e), Exit::Partial);
        assert_eq!(
            e.to_string(),
            "1 device(s) not deleted: /dev/ublkb1 (1 deleted)"
        );
        let mut none = Report::new(true);
        none.failed("/dev/ublkb0", anyhow::anyhow!("a"));
        none.failed("/dev/ublkb1", anyhow::anyhow!("b"));
        let e = none.finish("deleted").unwrap_err();
        assert_eq!(super::super::status::exit_of(&e), Exit::Failure);
    }
}
