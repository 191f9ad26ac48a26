//! The `lookup-server --mooncake-master` processes a chaos run puts in front of the
//! master for its ZeroMQ clients: built by cargo beside this program, started on a
//! free loopback port, killed on drop.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, bail};
use lookup_tokio::Endpoint;

/// Longest wait for a server to print its bound endpoint.
const SERVER_START: Duration = Duration::from_secs(30);

/// Builds `lookup-server` with the profile of this program (cargo's own), and returns
/// its path beside this program.
///
/// # Errors
/// cargo fails, or the binary is not where cargo puts it.
pub fn build() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating this program")?;
    let dir = exe.parent().context("this program's directory")?;
    let release = dir.file_name().is_some_and(|n| n == "release");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build.current_dir(mooncake_peers::workspace_root()).args([
        "build",
        "--quiet",
        "-p",
        "lookup-cli",
        "--bin",
        "lookup-server",
    ]);
    if release {
        build.arg("--release");
    }
    eprintln!("== building lookup-server (cargo build -p lookup-cli; minutes the first time)");
    let status = build.status().context("running cargo build")?;
    if !status.success() {
        bail!("cargo build -p lookup-cli --bin lookup-server failed ({status})");
    }
    let bin = dir.join("lookup-server");
    if !bin.is_file() {
        bail!(
            "lookup-server not found at {} after the build",
            bin.display()
        );
    }
    Ok(bin)
}

/// A running `lookup-server --mooncake-master`.
#[derive(Debug)]
pub struct Server {
    child: Child,
    /// Where it listens.
    pub endpoint: Endpoint,
    log: PathBuf,
}

impl Server {
    /// Starts `bin` in front of the master at `master` (`host:port` or `etcd://h:p`,
    /// with `cluster` for the latter), its presence cache on or off, going by read
    /// lease `lease_s` and client TTL `ttl_s`, and waits for its endpoint.
    ///
    /// # Errors
    /// It cannot run, or exits or prints no endpoint within 30 s (with its log).
    pub fn start(
        bin: &Path,
        master: &str,
        cluster: Option<&str>,
        cache: bool,
        lease_s: f64,
        ttl_s: f64,
        log_dir: &Path,
    ) -> anyhow::Result<Self> {
        let log = log_dir.join(format!("lookup-server-cache-{cache}.log"));
        let log_file = std::fs::File::create(&log)?;
        let mut command = Command::new(bin);
        command
            .args(["--bind", "tcp://127.0.0.1:0", "--mooncake-master", master])
            .arg(format!("--mooncake-presence-cache={cache}"))
            .arg(format!("--mooncake-lease-ttl-s={lease_s}"))
            .arg(format!("--client-ttl-s={ttl_s}"))
            .env("RUST_LOG", "warn");
        if let Some(cluster) = cluster {
            command.args(["--mooncake-cluster-id", cluster]);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("cannot run {}", bin.display()))?;
        let stdout = child.stdout.take().context("server stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            // Keep reading so the server never blocks on a full pipe.
            for _ in lines {}
        });
        let line = match rx.recv_timeout(SERVER_START) {
            Ok(Some(Ok(line))) => line,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "lookup-server printed no endpoint ({other:?}); its log ends:\n{}",
                    mooncake_peers::tail(&log)
                );
            }
        };
        let endpoint = line
            .trim()
            .parse()
            .with_context(|| format!("lookup-server printed {line:?}"))?;
        Ok(Self {
            child,
            endpoint,
            log,
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Whether a server's presence cache is on, and where it listens.
pub type CacheEndpoint = (bool, Endpoint);

/// A server with the presence cache off and one with it on, in front of `master`
/// (see [`Server::start`]), with their endpoints as the fleet takes them.
///
/// # Errors
/// Either server cannot start.
pub fn pair(
    bin: &Path,
    master: &str,
    cluster: Option<&str>,
    lease_s: f64,
    ttl_s: f64,
    log_dir: &Path,
) -> anyhow::Result<(Vec<Server>, Vec<CacheEndpoint>)> {
    let mut servers = Vec::new();
    let mut endpoints = Vec::new();
    for cache in [false, true] {
        let server = Server::start(bin, master, cluster, cache, lease_s, ttl_s, log_dir)?;
        endpoints.push((cache, server.endpoint.clone()));
        servers.push(server);
    }
    Ok((servers, endpoints))
}
