//! Helpers shared by the end-to-end tests in `tests/tests/`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Mutex, OnceLock};

/// The binary `bin` of workspace package `package`, built once per test process with
/// `features` and the profile of the running test (`target/<profile>/<bin>`).
///
/// # Panics
/// When `cargo build` fails or the binary is missing afterwards: the test cannot run.
pub fn cargo_bin(package: &str, bin: &str, features: &[&str]) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let key = format!("{package}/{bin}/{}", features.join(","));
    let mut built = BUILT
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(path) = built.get(&key) {
        return path.clone();
    }
    // target/<profile>/deps/<test>-HASH -> target/<profile>/<bin>
    let exe = std::env::current_exe().expect("test executable");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "--quiet", "-p", package, "--bin", bin]);
    if !features.is_empty() {
        build.args(["--features", &features.join(",")]);
    }
    if profile_dir.file_name().is_some_and(|p| p == "release") {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build");
    assert!(status.success(), "cargo build of {bin} failed");
    let path = profile_dir.join(bin);
    assert!(path.exists(), "{} missing after the build", path.display());
    built.insert(key, path.clone());
    path
}

/// A child process killed (and reaped) on drop, so a failing test leaves none behind.
#[derive(Debug)]
pub struct KilledOnDrop(pub Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
