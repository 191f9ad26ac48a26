//! `cargo xtask test`: the README's test command. Installs what the real-peer tests
//! need (the pinned Mooncake wheel in `.venv`, Debian's `libibverbs1`, pyzmq for the
//! Python interop peer), then runs every test of the workspace. The tests start and
//! stop their own `mooncake_master` processes (on free loopback ports), so a failing
//! test never leaves one behind.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// Arguments of `cargo xtask test`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Skip the installation step (use what is already installed).
    #[arg(long)]
    pub no_install: bool,
    /// Extra arguments passed to `cargo test` (after `--workspace`), e.g. `-- --nocapture`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub cargo_args: Vec<String>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace root")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed: {status}");
    }
    Ok(())
}

/// Installs the test peers (unless `--no-install`) and runs `cargo test --workspace`.
///
/// # Errors
/// When an install step or the tests fail, naming the command.
pub fn run_tests(args: &Args) -> anyhow::Result<()> {
    let root = root();
    if !args.no_install {
        eprintln!("== Mooncake master, Python client and etcd (scripts/mooncake/install.sh)");
        run(Command::new("bash")
            .arg(root.join("scripts/mooncake/install.sh"))
            .current_dir(&root))?;
        let has_zmq = Command::new("python3")
            .args(["-c", "import zmq"])
            .status()
            .is_ok_and(|s| s.success());
        if !has_zmq {
            eprintln!("== pyzmq 27.3.0 (the independent Python peer of the interop tests)");
            run(Command::new("python3").args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "pyzmq==27.3.0",
            ]))?;
        }
    }
    eprintln!("== cargo test --workspace");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo)
        .args(["test", "--workspace"])
        .args(&args.cargo_args)
        .current_dir(&root))
}
