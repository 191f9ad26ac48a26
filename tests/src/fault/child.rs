//! [`ChildServer`]: a `LookupServer` in a child process (the test binary run again),
//! to kill it for real or to keep its memory out of the client's.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lookup_tokio::Endpoint;

use super::*;

/// Environment variable that turns this test binary's `child_server` test into a
/// lookup server on the URL it holds.
pub const CHILD_ENV: &str = "LOOKUP_FAULT_CHILD_SERVER";
/// Line the child prints once bound.
pub const CHILD_READY: &str = "LOOKUP_FAULT_CHILD_READY";

/// Body of the `#[ignore]`d `child_server` test of a binary that spawns
/// [`ChildServer`]s: without [`CHILD_ENV`] it returns at once (so `--ignored` runs
/// are harmless); with it, it serves the workload ([`ChainIndex`]) until its stdin
/// closes, which also happens when the parent dies.
pub fn child_server_main() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let endpoint: Endpoint = url.parse().expect("child endpoint");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let server = chain_server(&endpoint, Arc::new(ChainIndex::new()));
        let mut out = std::io::stdout();
        writeln!(out, "{CHILD_READY}").expect("stdout");
        out.flush().expect("stdout");
        let _ = tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        })
        .await;
        server.shutdown().await;
    });
}

/// A `LookupServer` in a child process: this test binary, run again on its
/// `child_server` test. Killed (SIGKILL) and reaped on drop.
pub struct ChildServer {
    child: Child,
    ready: std::sync::mpsc::Receiver<()>,
}

impl ChildServer {
    /// Starts the child serving `endpoint`; `test` is the name of the binary's test
    /// that calls [`child_server_main`].
    pub fn spawn(test: &str, endpoint: &Endpoint) -> Self {
        let exe = std::env::current_exe().expect("test binary path");
        let mut child = Command::new(exe)
            .args([
                test,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, endpoint.url())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the child server");
        let stdout = child.stdout.take().expect("child stdout");
        let (tx, ready) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The test harness prints "test child_server ... " first, without a newline.
                if line.trim_end().ends_with(CHILD_READY) {
                    let _ = tx.send(());
                }
            }
        });
        Self { child, ready }
    }

    /// Waits until the child has bound its endpoint; false after `limit`.
    pub fn wait_ready(&self, limit: Duration) -> bool {
        self.ready.recv_timeout(limit).is_ok()
    }

    /// The child process id (for its `/proc` status).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`"STOP"`, `"CONT"`) with `kill(1)`: a stopped server keeps its
    /// socket and connections (the kernel still accepts into its backlog) but
    /// answers nothing, not even a ZeroMQ greeting.
    ///
    /// Returns once every thread of the child is in the state the signal asks for
    /// (stopped after STOP, running after CONT), read from `/proc`: `kill` returns
    /// when the signal is queued, and a thread running on another core may still
    /// answer a request before it stops.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill(1)");
        assert!(status.success(), "kill -{signal} failed");
        let want_stopped = signal == "STOP";
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.all_threads_stopped() != want_stopped {
            assert!(
                Instant::now() < deadline,
                "the child never took SIG{signal}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether every thread of the child is stopped by a signal (state `T` in
    /// `/proc/<pid>/task/<tid>/stat`).
    fn all_threads_stopped(&self) -> bool {
        let tasks = format!("/proc/{}/task", self.child.id());
        let Ok(entries) = std::fs::read_dir(&tasks) else {
            return false;
        };
        entries.flatten().all(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state follows the command name, which is in parentheses.
            stat.rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next())
                .is_some_and(|state| state == 'T')
        })
    }

    /// SIGKILL, then reap: the server gets no chance to close its socket or unlink
    /// its ipc file.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Closes the child's stdin, so it shuts its server down cleanly, and reaps it
    /// (killed if it has not exited after `limit`).
    pub fn stop(mut self, limit: Duration) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.kill();
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        self.kill();
    }
}
