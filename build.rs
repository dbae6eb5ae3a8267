//! Stamps the build with the commit it was made from (`srp-ublk --version`): SRP_UBLK_COMMIT when
//! set (a build from a source tarball), else `git describe` of the checkout, else "unknown".

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=SRP_UBLK_COMMIT");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/index");
    let commit = std::env::var("SRP_UBLK_COMMIT").ok().or_else(|| {
        let out = Command::new("git")
            .args(["describe", "--always", "--dirty", "--abbrev=12"])
            .output()
            .ok()?;
        let s = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !s.trim().is_empty()).then(|| s.trim().to_string())
    });
    println!(
        "cargo:rustc-env=SRP_UBLK_COMMIT={}",
        commit.unwrap_or_else(|| "unknown".into())
    );
}
