//! Real Mooncake peers on loopback, for the end-to-end tests (`lookup-tests`, as its
//! `mooncake` module) and the xtask tools that run against real processes
//! (`cargo xtask chaos`).
//!
//! - [`Master`]: `mooncake_master` on free loopback ports, killed on drop (also when
//!   the test panics).
//! - [`Writer`]: `python/writer.py` of this crate ([`writer_script`]), the PyPI client
//!   (`mooncake.store.MooncakeDistributedStore`) driven over stdin/stdout: it writes
//!   blocks, and answers with its own `batch_is_exist` as the reference. It stays
//!   alive for the test because the master drops a client's keys when it closes.
//! - [`ha`]: a real etcd and masters in high-availability mode.
//! - [`release`]: the masters of the other Mooncake releases users run (0.3.10,
//!   0.3.14), for [`Master::start_release`] and [`Writer::start_for`].
//!
//! Both come from `scripts/mooncake/install.sh` (the pinned wheel in `.venv`). A missing
//! binary fails with a message naming that script: never skipped, never a hang. The
//! launchers panic on failure (a test's failure); a tool checks first with
//! [`find_master_bin`], [`find_python_bin`] and [`ha::find_etcd_bin`], which return
//! that message as an error instead.

pub mod ha;
pub mod release;

pub use release::Release;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Longest wait for a master to accept connections, in seconds (it takes ~0.1 s).
const MASTER_START_SECS: u64 = 15;
/// Longest wait for one answer of the Python writer, in seconds (setup takes ~1 s).
const WRITER_ANSWER_SECS: u64 = 60;
/// Times a master is started when a port it was given was taken meanwhile.
const PORT_ATTEMPTS: usize = 3;
/// Most keys per writer command line.
const KEYS_PER_LINE: usize = 500;

/// The Python store client's source (`python/writer.py` of this crate): it puts and
/// removes keys through the PyPI `MooncakeDistributedStore`, one command per line on
/// its stdin (see its docstring).
pub const WRITER_SCRIPT: &str = include_str!("../python/writer.py");

/// [`WRITER_SCRIPT`] written once per process to a file in the temp dir, for
/// `python writer.py MASTER_ADDR` ([`Writer`] runs it so; a downstream test may too).
///
/// # Panics
/// When the temp dir cannot be written.
pub fn writer_script() -> PathBuf {
    static WRITTEN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    WRITTEN
        .get_or_init(|| {
            let path = std::env::temp_dir()
                .join(format!("mooncake-peers-writer-{}.py", std::process::id()));
            std::fs::write(&path, WRITER_SCRIPT)
                .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            path
        })
        .clone()
}

/// The root of the workspace this process runs in, found at run time: the nearest
/// directory at or above `$CARGO_MANIFEST_DIR` (which cargo sets for what it runs:
/// `cargo run`, `cargo test`, `cargo xtask`) or, run outside cargo, the current
/// directory, whose `Cargo.toml` has a `[workspace]` table ([`find_workspace_root`]).
/// Never the directory this crate was compiled in: two checkouts sharing one target
/// directory share its binaries, and each must find its own `.venv` and scripts. That
/// start directory itself when no workspace is above it.
#[must_use]
pub fn workspace_root() -> PathBuf {
    let start = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_else(|| PathBuf::from("."));
    find_workspace_root(&start).unwrap_or(start)
}

/// The nearest directory at or above `start` whose `Cargo.toml` has a `[workspace]`
/// table (a line `[workspace]`, as cargo writes it), or `None` when there is none.
#[must_use]
pub fn find_workspace_root(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .find(|dir| {
            std::fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|manifest| manifest.lines().any(|line| line.trim() == "[workspace]"))
        })
        .map(Path::to_path_buf)
}

const INSTALL_HINT: &str = "install it with `bash scripts/mooncake/install.sh` in this \
    repository (Debian libibverbs1 + PyPI mooncake-transfer-engine-non-cuda==0.3.13.post1 into \
    .venv), or elsewhere `apt-get install libibverbs1` and `pip install \
    mooncake-transfer-engine-non-cuda==0.3.13.post1` (which puts mooncake_master and python \
    on PATH)";

/// `$var` if set, else `default` under the workspace root (this repository's
/// `.venv`), else the file's name on `PATH` (a downstream project that installed the
/// wheel itself); an error naming `what` and the install steps when none exists.
fn find(var: &str, default: &str, what: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os(var).map_or_else(
        || {
            let local = workspace_root().join(default);
            if local.is_file() {
                return local;
            }
            let name = Path::new(default)
                .file_name()
                .unwrap_or_default()
                .to_owned();
            std::env::var_os("PATH")
                .iter()
                .flat_map(std::env::split_paths)
                .map(|dir| dir.join(&name))
                .find(|p| p.is_file())
                .unwrap_or(local)
        },
        PathBuf::from,
    );
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{what} not found at {}: {INSTALL_HINT} (or set {var})",
            path.display()
        ))
    }
}

/// The `mooncake_master` to run: `$MOONCAKE_MASTER_BIN`, else `.venv/bin/mooncake_master`.
///
/// # Errors
/// When the file does not exist: a message naming the install script.
pub fn find_master_bin() -> Result<PathBuf, String> {
    find(
        "MOONCAKE_MASTER_BIN",
        ".venv/bin/mooncake_master",
        "mooncake_master",
    )
}

/// [`find_master_bin`] for a test.
///
/// # Panics
/// When the file does not exist, naming the install script.
pub fn master_bin() -> PathBuf {
    find_master_bin().unwrap_or_else(|e| panic!("{e}"))
}

/// The Python with the `mooncake` package: `$MOONCAKE_PYTHON`, else `.venv/bin/python`.
///
/// # Errors
/// When the file does not exist: a message naming the install script.
pub fn find_python_bin() -> Result<PathBuf, String> {
    find(
        "MOONCAKE_PYTHON",
        ".venv/bin/python",
        "the Mooncake Python client's interpreter",
    )
}

/// [`find_python_bin`] for a test.
///
/// # Panics
/// When the file does not exist, naming the install script.
pub fn python_bin() -> PathBuf {
    find_python_bin().unwrap_or_else(|e| panic!("{e}"))
}

/// Lowest port handed out by [`free_port`]: the range from here to the kernel's
/// ephemeral ports is for the servers the tests start.
const FREE_PORTS_FROM: u16 = 10_000;

/// A loopback port nobody listened on a moment ago, below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`) when there is room: a port of that range
/// can also become the local port of any outgoing connection between this check and
/// the server's bind (a master then exits with "Address already in use"), a port below
/// it only by another explicit bind. Each process starts at its own random place in
/// the range and walks it, so that parallel test processes rarely try the same port.
pub fn free_port() -> u16 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    static START: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let below = ephemeral_low().unwrap_or(32_768);
    if below > FREE_PORTS_FROM + 1_000 {
        let span = usize::from(below - FREE_PORTS_FROM);
        // RandomState's keys are random per process.
        let start = *START.get_or_init(|| {
            use std::hash::{BuildHasher, Hasher};
            let random = std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish();
            usize::try_from(random % span as u64).unwrap_or(0)
        });
        for _ in 0..span {
            let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
            let port = FREE_PORTS_FROM + u16::try_from(offset).unwrap_or(0);
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// The first port of the kernel's ephemeral range, when Linux says.
fn ephemeral_low() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A running `mooncake_master`, killed on drop.
#[derive(Debug)]
pub struct Master {
    child: Option<Child>,
    rpc_port: u16,
    metrics_port: u16,
    log: PathBuf,
}

impl Master {
    /// Starts a master on free ports and waits until it accepts connections (both
    /// ports picked again, at most 3 times, when one was taken meanwhile).
    ///
    /// # Panics
    /// When the master fails otherwise, or every attempt found a port taken, with its
    /// log's tail.
    pub fn start() -> Self {
        Self::started(|| Self::spawn(free_port(), &[]))
    }

    /// Starts a master on `rpc_port` (e.g. again after [`stop`](Self::stop)), its
    /// metrics on a free port (another one, at most 3 times, when that one was taken
    /// meanwhile).
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_on(rpc_port: u16) -> Self {
        Self::started(|| Self::spawn(rpc_port, &[]))
    }

    /// The first master of `spawn` that listens within [`MASTER_START_SECS`]: a master
    /// that exits because a port it was given was taken meanwhile ("Address already in
    /// use") is spawned again (a new metrics port each time), at most
    /// [`PORT_ATTEMPTS`] times.
    ///
    /// # Panics
    /// When a master fails otherwise, or every attempt found a port taken, with the
    /// last log's tail.
    fn started(mut spawn: impl FnMut() -> Self) -> Self {
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let mut master = spawn();
            match master.try_wait_ready(MASTER_START_SECS) {
                Ok(()) => return master,
                Err(e) if e.contains("Address already in use") => last = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("{last}")
    }

    /// Runs `mooncake_master` on loopback with `extra` flags, without waiting.
    ///
    /// # Panics
    /// As [`try_spawn`](Self::try_spawn) fails.
    pub fn spawn(rpc_port: u16, extra: &[String]) -> Self {
        Self::try_spawn(&master_bin(), rpc_port, extra, &std::env::temp_dir())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts the master of another `release` on free ports with `extra` flags and
    /// waits until it accepts connections.
    ///
    /// # Panics
    /// When it cannot run or does not listen in time, with its log's tail.
    pub fn start_release(release: &Release, extra: &[String]) -> Self {
        Self::started(|| {
            Self::spawn_with(
                &release.master_bin,
                free_port(),
                extra,
                &std::env::temp_dir(),
                release.metrics_host,
            )
            .unwrap_or_else(|e| panic!("{e}"))
        })
    }

    /// Runs `bin` on loopback at `rpc_port` (metrics on a free port) with `extra`
    /// flags, its log in `log_dir`, without waiting.
    ///
    /// # Errors
    /// The log cannot be created or the binary cannot run (naming the install script).
    pub fn try_spawn(
        bin: &Path,
        rpc_port: u16,
        extra: &[String],
        log_dir: &Path,
    ) -> Result<Self, String> {
        Self::spawn_with(bin, rpc_port, extra, log_dir, true)
    }

    /// As [`try_spawn`](Self::try_spawn); `metrics_host` passes `-metrics_host`
    /// (which masters before 0.3.11 refuse: theirs binds every interface).
    fn spawn_with(
        bin: &Path,
        rpc_port: u16,
        extra: &[String],
        log_dir: &Path,
        metrics_host: bool,
    ) -> Result<Self, String> {
        let metrics_port = free_port();
        let log = log_dir.join(format!(
            "mooncake-master-{}-{rpc_port}.log",
            std::process::id()
        ));
        let log_file =
            std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
        let log_out = log_file
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(bin)
            .arg("--rpc_address=127.0.0.1")
            .arg(format!("--rpc_port={rpc_port}"))
            .args(metrics_host.then_some("--metrics_host=127.0.0.1"))
            .arg(format!("--metrics_port={metrics_port}"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log_out)
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}; {INSTALL_HINT}", bin.display()))?;
        Ok(Self {
            child: Some(child),
            rpc_port,
            metrics_port,
            log,
        })
    }

    /// Waits until the RPC port accepts connections, for at most `secs` seconds.
    ///
    /// # Panics
    /// When the master exits first or the time runs out, with its log's tail.
    pub fn wait_ready(&mut self, secs: u64) {
        self.try_wait_ready(secs).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Waits until the RPC port accepts connections, for at most `secs` seconds.
    ///
    /// # Errors
    /// The master exits first or the time runs out (with its log's tail).
    pub fn try_wait_ready(&mut self, secs: u64) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if TcpStream::connect(("127.0.0.1", self.rpc_port)).is_ok() {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(format!(
                    "mooncake_master exited with {status} before listening on port {}:\n{}",
                    self.rpc_port,
                    self.log_tail()
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "mooncake_master did not listen on port {} within {secs} s:\n{}",
                    self.rpc_port,
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id while it runs (for its CPU time in `/proc/<pid>/stat`).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `127.0.0.1:{rpc_port}`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.rpc_port)
    }

    /// The RPC port.
    pub fn rpc_port(&self) -> u16 {
        self.rpc_port
    }

    /// The admin HTTP port (`GET /leader`, `/metrics`).
    pub fn metrics_port(&self) -> u16 {
        self.metrics_port
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills the master (SIGKILL: no goodbye on its connections) and reaps it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The last lines of the master's log, for failure messages.
    pub fn log_tail(&self) -> String {
        tail(&self.log)
    }
}

/// The last 20 lines of a log file.
pub fn tail(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

impl Drop for Master {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The Python store client ([`writer_script`]), killed on drop.
pub struct Writer {
    child: Child,
    stdin: ChildStdin,
    answers: mpsc::Receiver<String>,
    log: PathBuf,
}

impl Writer {
    /// Starts a writer connected to `master` and waits for its `ready`.
    pub fn start(master: &Master) -> Self {
        Self::start_at(&master.addr(), &[])
    }

    /// Starts a writer connected to `master`, a master of `release`: the release's
    /// own Python client when the pinned one cannot write into it
    /// ([`Release::python_path`]).
    pub fn start_for(master: &Master, release: &Release) -> Self {
        match &release.python_path {
            Some(path) => {
                let path = path.to_string_lossy();
                Self::start_at(&master.addr(), &[("PYTHONPATH", &path)])
            }
            None => Self::start(master),
        }
    }

    /// Starts a writer with the master address `addr` (`host:port` or
    /// `etcd://h:p`) and extra environment variables (`MC_STORE_CLUSTER_ID`,
    /// `PYTHONPATH`), and waits for its `ready`.
    pub fn start_at(addr: &str, env: &[(&str, &str)]) -> Self {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let script = writer_script();
        // The native client logs a lot: kept in a file, shown when something fails.
        let log = std::env::temp_dir().join(format!(
            "mooncake-writer-{}-{}.log",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let log_file = std::fs::File::create(&log).expect("create the writer's log file");
        let mut child = Command::new(python_bin())
            .arg(&script)
            .arg(addr)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}; {INSTALL_HINT}", script.display()));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, answers) = mpsc::channel();
        // A thread owns the pipe so that every wait has a deadline.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut writer = Self {
            child,
            stdin,
            answers,
            log,
        };
        let ready = writer.answer("setup");
        assert_eq!(
            ready,
            "ready",
            "writer.py setup failed; its log ends:\n{}",
            tail(&writer.log)
        );
        writer
    }

    fn answer(&mut self, command: &str) -> String {
        match self
            .answers
            .recv_timeout(Duration::from_secs(WRITER_ANSWER_SECS))
        {
            Ok(line) => line,
            Err(e) => {
                let status = self.child.try_wait().ok().flatten();
                panic!(
                    "writer.py gave no answer to {command:?} ({e}); exit status {status:?}; \
                     its log ends:\n{}",
                    tail(&self.log)
                )
            }
        }
    }

    fn command(&mut self, verb: &str, args: &[&str]) -> String {
        for arg in args {
            assert!(
                !arg.is_empty() && !arg.contains(char::is_whitespace),
                "writer.py arguments are whitespace-free words: {arg:?}"
            );
        }
        let line = format!("{verb} {}\n", args.join(" "));
        self.stdin
            .write_all(line.as_bytes())
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|e| panic!("writer.py stdin: {e}"));
        self.answer(verb)
    }

    /// Stores each key (a 1-byte value) with the Python client's `put`.
    pub fn put<K: AsRef<str>>(&mut self, keys: &[K]) {
        for chunk in keys.chunks(KEYS_PER_LINE) {
            let words: Vec<&str> = chunk.iter().map(AsRef::as_ref).collect();
            let answer = self.command("put", &words);
            assert_eq!(
                answer,
                format!("ok {}", words.len()),
                "put failed; writer.py's log ends:\n{}",
                tail(&self.log)
            );
        }
    }

    /// Removes each key (forced: existence probes grant read leases).
    pub fn remove<K: AsRef<str>>(&mut self, keys: &[K]) {
        for chunk in keys.chunks(KEYS_PER_LINE) {
            let words: Vec<&str> = chunk.iter().map(AsRef::as_ref).collect();
            let answer = self.command("remove", &words);
            assert_eq!(
                answer,
                format!("ok {}", words.len()),
                "remove failed; writer.py's log ends:\n{}",
                tail(&self.log)
            );
        }
    }

    /// The Python client's `batch_is_exist(keys)`: 1 present, 0 absent, -1 error.
    pub fn exist<K: AsRef<str>>(&mut self, keys: &[K]) -> Vec<i64> {
        let words: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
        let answer = self.command("exist", &words);
        parse_numbers(&answer, "exist")
    }

    /// `reps` timed `batch_is_exist(keys)` calls inside Python, in nanoseconds each.
    pub fn bench<K: AsRef<str>>(&mut self, reps: usize, keys: &[K]) -> Vec<i64> {
        let reps = reps.to_string();
        let mut words = vec![reps.as_str()];
        words.extend(keys.iter().map(AsRef::as_ref));
        let answer = self.command("bench", &words);
        parse_numbers(&answer, "bench")
    }
}

fn parse_numbers(answer: &str, verb: &str) -> Vec<i64> {
    let mut words = answer.split_whitespace();
    assert_eq!(words.next(), Some(verb), "writer.py answered {answer:?}");
    words
        .map(|w| {
            w.parse()
                .unwrap_or_else(|e| panic!("writer.py answered {answer:?}: {e}"))
        })
        .collect()
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Killing is enough: the master forgets the client's keys either way, and a
        // polite close takes 1-2 s.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_below_the_ephemeral_range_and_free() {
        let below = ephemeral_low().expect("Linux names its ephemeral range");
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        for &port in &ports {
            assert!((FREE_PORTS_FROM..below).contains(&port), "port {port}");
            TcpListener::bind(("127.0.0.1", port)).expect("free");
        }
        // One process walks the range: no port twice in a row of calls.
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len());
    }
}
