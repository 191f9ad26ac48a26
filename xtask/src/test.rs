//! `cargo xtask test`: the README's test command. Installs what the real-peer tests
//! need (the pinned Mooncake wheel in `.venv`, Debian's `libibverbs1`, pyzmq for the
//! Python interop peer), then runs every test of the workspace. The tests start and
//! stop their own `mooncake_master` processes (on free loopback ports), so a failing
//! test never leaves one behind. Everything it writes is under the checkout it runs in
//! ([`mooncake_peers::workspace_root`], found at run time), whichever checkout built
//! the binary.

use std::process::Command;

use anyhow::{Context, bail};

/// Arguments of `cargo xtask test`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Skip the installation step (use what is already installed).
    #[arg(long)]
    pub no_install: bool,
    /// Print the checkout and the commands, one a line, and run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Extra arguments passed to `cargo test` (after `--workspace`), e.g. `-- --nocapture`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub cargo_args: Vec<String>,
}

/// Runs `cmd`, or with `dry_run` prints it (`cd DIR && PROGRAM ARGS...`) and runs nothing.
fn run(cmd: &mut Command, dry_run: bool) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    if dry_run {
        println!("{shown}");
        return Ok(());
    }
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
    let root = mooncake_peers::workspace_root();
    let dry_run = args.dry_run;
    if dry_run {
        println!("checkout: {}", root.display());
    }
    if !args.no_install {
        eprintln!("== Mooncake master, Python client and etcd (scripts/mooncake/install.sh)");
        run(
            Command::new("bash")
                .arg(root.join("scripts/mooncake/install.sh"))
                .current_dir(&root),
            dry_run,
        )?;
        let has_zmq = Command::new("python3")
            .args(["-c", "import zmq"])
            .status()
            .is_ok_and(|s| s.success());
        if !has_zmq {
            eprintln!("== pyzmq 27.3.0 (the independent Python peer of the interop tests)");
            run(
                Command::new("python3").args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "pyzmq==27.3.0",
                ]),
                dry_run,
            )?;
        }
    }
    eprintln!("== cargo test --workspace");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(
        Command::new(cargo)
            .args(["test", "--workspace"])
            .args(&args.cargo_args)
            .current_dir(&root),
        dry_run,
    )
}
