//! The seed configurations (`../shared/seed-configs/`) load and serve:
//! runs the shared checker against the real binary. Skipped, with a
//! message, when the shared directory is not beside the checkout.

use std::process::Command;

use crate::harness::BIN;

#[test]
fn every_seed_config_loads_and_serves() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/seed-configs");
    let check = dir.join("check.py");
    if !check.exists() {
        eprintln!("skipped: {} not found", check.display());
        return;
    }
    let out = Command::new("python3")
        .arg(&check)
        .arg(BIN)
        .output()
        .expect("run check.py");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let last = text
        .lines()
        .rfind(|l| l.contains(" passed, "))
        .unwrap_or("")
        .to_string();
    assert!(
        out.status.success() && last.ends_with(" 0 failed"),
        "check.py:\n{}",
        text
    );
    assert!(
        last.starts_with("9 passed"),
        "expected all 9 seed checks: {}",
        last
    );
}
