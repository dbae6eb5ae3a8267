//! docs/troubleshooting.md quotes srp-ublk's messages as it prints them (its ```text blocks): each
//! must still be a message the code prints, so that an administrator who searches the page for what
//! the terminal says finds it. A message's fixed parts are checked against the sources: the parts
//! between the page's `<...>` placeholders and between the pieces the code joins ("a: b" of an
//! error and its cause, "(...)" and " - " of a message built from parts).

use std::path::Path;

/// Every `.rs` file under `dir`, concatenated.
fn sources(dir: &Path, out: &mut String) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&p).unwrap());
            out.push('\n');
        }
    }
}

/// The sources with Rust's string continuations undone: a backslash that ends a line and the next
/// line's leading whitespace are not in the string.
fn joined(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut chars = src.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' && chars.peek() == Some(&'\n') {
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The fixed pieces of a quoted message long enough to mean something (12 characters or more).
fn pieces(line: &str) -> Vec<String> {
    let mut fixed = String::new();
    let mut in_placeholder = false;
    for c in line.chars() {
        match c {
            '<' => {
                in_placeholder = true;
                fixed.push('\0');
            }
            '>' if in_placeholder => in_placeholder = false,
            _ if in_placeholder => {}
            _ => fixed.push(c),
        }
    }
    fixed
        .split(['\0', '(', ')'])
        .flat_map(|p| p.split(" - "))
        .flat_map(|p| p.split(": "))
        .map(|p| p.trim().trim_end_matches('.'))
        .filter(|p| p.len() >= 12)
        .map(String::from)
        .collect()
}

/// The lines of the page's ```text blocks: srp-ublk's own messages (other programs' output, a
/// VMM's say, is quoted in ```console blocks).
fn quoted(page: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in page.lines() {
        if inside && line.starts_with("```") {
            inside = false;
        } else if inside {
            out.push(line);
        } else if line == "```text" {
            inside = true;
        }
    }
    out
}

#[test]
fn every_message_the_troubleshooting_page_quotes_is_one_the_code_prints() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/troubleshooting.md")).unwrap();
    let mut src = String::new();
    sources(&root.join("src"), &mut src);
    let src = joined(&src);
    let lines = quoted(&page);
    assert!(
        lines.len() >= 12,
        "the page quotes {} messages",
        lines.len()
    );
    let mut missing = Vec::new();
    for line in &lines {
        let p = pieces(line);
        assert!(!p.is_empty(), "nothing to check in {line:?}");
        missing.extend(p.into_iter().filter(|p| !src.contains(p.as_str())));
    }
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md quotes text no message has: {missing:#?}"
    );
}

#[test]
fn the_check_finds_a_message_that_is_not_there() {
    let src =
        joined("bail!(\"no /dev/ublk-control: the ublk driver is not loaded; \\\n    run it\")");
    assert!(src.contains("the ublk driver is not loaded; run it"));
    let p = pieces("target <dest> is unreachable over RDMA (<detail>): check that a cable is in");
    assert_eq!(p, ["is unreachable over RDMA", "check that a cable is in"]);
    assert!(!src.contains(p[1].as_str()));
}
