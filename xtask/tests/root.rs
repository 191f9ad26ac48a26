//! `cargo xtask test` finds the checkout it runs in at run time: a binary built in one
//! checkout (this one) and run from another (as when two checkouts share one target
//! directory) installs into, and tests, the other one only.

use std::path::Path;
use std::process::Command;

/// A second checkout: a workspace manifest and an `xtask` crate directory, nothing else.
fn second_checkout() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("Cargo.toml"),
        "[workspace]\nmembers = [\"xtask\"]\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("xtask/src")).unwrap();
    std::fs::write(
        dir.path().join("xtask/Cargo.toml"),
        "[package]\nname = \"xtask\"\n",
    )
    .unwrap();
    dir
}

/// `cargo xtask test --dry-run`'s lines, run as `cargo xtask` runs it: from `cwd`, with
/// `manifest_dir` as cargo's run-time `CARGO_MANIFEST_DIR` (or none).
fn dry_run(cwd: &Path, manifest_dir: Option<&Path>) -> Vec<String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(["test", "--dry-run"]).current_dir(cwd);
    match manifest_dir {
        Some(dir) => cmd.env("CARGO_MANIFEST_DIR", dir),
        None => cmd.env_remove("CARGO_MANIFEST_DIR"),
    };
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// This checkout, where the binary was built.
fn this_checkout() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

#[test]
fn the_test_command_touches_only_the_checkout_it_runs_in() {
    let second = second_checkout();
    let root = second.path().canonicalize().unwrap();
    let xtask_dir = root.join("xtask");
    let lines = dry_run(&xtask_dir, Some(&xtask_dir));
    let root_s = root.display().to_string();
    assert_eq!(lines[0], format!("checkout: {root_s}"));
    // The install script and `cargo test --workspace`, both in the second checkout.
    let install = format!(
        "cd {root_s:?} && \"bash\" {:?}",
        root.join("scripts/mooncake/install.sh")
            .display()
            .to_string()
    );
    assert_eq!(lines[1], install);
    let last = lines.last().unwrap();
    assert!(last.starts_with(&format!("cd {root_s:?} && ")), "{last}");
    assert!(last.ends_with("\"test\" \"--workspace\""), "{last}");
    let here = this_checkout().display().to_string();
    for line in &lines {
        assert!(
            !line.contains(&here),
            "{line} names the checkout that built xtask"
        );
    }
}

#[test]
fn outside_cargo_the_checkout_is_found_from_the_current_directory() {
    let second = second_checkout();
    let root = second.path().canonicalize().unwrap();
    let lines = dry_run(&root.join("xtask/src"), None);
    assert_eq!(lines[0], format!("checkout: {}", root.display()));
}
