//! The real peers of a replay: a `mooncake_master` process (or one given with
//! `--master`), its metrics port, and the Python store client that writes blocks
//! (`mooncake_peers::writer_script`, the PyPI `MooncakeDistributedStore`).
//!
//! Both programs come from `bash scripts/mooncake/install.sh` (the pinned wheel in
//! `.venv`); a missing one is an error naming that script.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;

/// Longest wait for a master to accept connections (it takes ~0.1 s).
const MASTER_START: Duration = Duration::from_secs(15);
/// Longest wait for one answer of the Python writer (its setup takes ~1 s).
const WRITER_ANSWER: Duration = Duration::from_secs(60);
/// Most keys per writer command line.
const KEYS_PER_LINE: usize = 500;
/// The master counters and gauges a replay reports (`GET /metrics` of
/// `mooncake_master`, PyPI 0.3.13.post1).
pub const MASTER_SERIES: [&str; 10] = [
    "master_batch_exist_key_requests_total",
    "master_batch_exist_key_items_total",
    "master_batch_exist_key_failures_total",
    "master_put_start_requests_total",
    "master_put_start_failures_total",
    "master_batch_put_start_items_total",
    "master_batch_put_start_failed_items_total",
    "master_key_count",
    "master_evicted_key_count",
    "master_allocated_bytes",
];

const INSTALL_HINT: &str = "install it with `bash scripts/mooncake/install.sh` \
    (PyPI mooncake-transfer-engine-non-cuda==0.3.13.post1 into .venv)";

/// The root of the checkout this runs in, found at run time.
pub use mooncake_peers::workspace_root;

/// `mooncake_master` to run: `$MOONCAKE_MASTER_BIN`, else `.venv/bin/mooncake_master`.
#[must_use]
pub fn default_master_bin() -> PathBuf {
    std::env::var_os("MOONCAKE_MASTER_BIN").map_or_else(
        || workspace_root().join(".venv/bin/mooncake_master"),
        PathBuf::from,
    )
}

/// The Python with the `mooncake` package: `$MOONCAKE_PYTHON`, else `.venv/bin/python`.
#[must_use]
pub fn default_python() -> PathBuf {
    std::env::var_os("MOONCAKE_PYTHON")
        .map_or_else(|| workspace_root().join(".venv/bin/python"), PathBuf::from)
}

use mooncake_peers::tail;

/// The master a replay talks to: one it started (killed on drop), or one given.
#[derive(Debug)]
pub struct Master {
    started: Option<mooncake_peers::Master>,
    /// `host:port` of the RPC service.
    pub addr: String,
    /// `host:port` of the metrics HTTP service, when known.
    pub metrics: Option<String>,
}

impl Master {
    /// Starts `bin` on free loopback ports and waits until it accepts connections.
    ///
    /// # Errors
    /// The binary is missing (naming the install script) or cannot run; it exits or
    /// does not listen within 15 s (with the end of its log).
    pub fn start(bin: &Path, log_dir: &Path) -> anyhow::Result<Self> {
        if !bin.is_file() {
            bail!(
                "mooncake_master not found at {}: {INSTALL_HINT}",
                bin.display()
            );
        }
        let mut master =
            mooncake_peers::Master::try_spawn(bin, mooncake_peers::free_port(), &[], log_dir)
                .map_err(anyhow::Error::msg)?;
        master
            .try_wait_ready(MASTER_START.as_secs())
            .map_err(anyhow::Error::msg)?;
        Ok(Self {
            addr: master.addr(),
            metrics: Some(format!("127.0.0.1:{}", master.metrics_port())),
            started: Some(master),
        })
    }

    /// The process id of a master this replay started (for its CPU time in
    /// `/proc/<pid>/stat`); `None` for an external one.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.started.as_ref().and_then(mooncake_peers::Master::pid)
    }

    /// A master that runs elsewhere, at `addr`, with its metrics at `metrics`.
    #[must_use]
    pub fn external(addr: String, metrics: Option<String>) -> Self {
        Self {
            started: None,
            addr,
            metrics,
        }
    }
}

/// The counters and gauges of [`MASTER_SERIES`] (unlabelled samples) that the master
/// with its metrics at `addr` (`host:port`) exposes on `GET /metrics`.
///
/// # Errors
/// The metrics port cannot be reached or answers something else than a 200.
pub fn scrape(addr: &str) -> anyhow::Result<HashMap<String, f64>> {
    let text = http_get(addr, "/metrics")?;
    let mut out = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if MASTER_SERIES.contains(&name) {
            if let Ok(v) = value.trim().parse::<f64>() {
                out.insert(name.to_owned(), v);
            }
        }
    }
    Ok(out)
}

/// The body of `GET path` on `addr`. The master's HTTP server (cinatra) answers
/// HTTP/1.1 with a `Content-Length` and keeps the connection open whatever the
/// request says, so the body is read by its length, not to the end of the stream.
fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    let socket = addr
        .to_socket_addrs()
        .with_context(|| format!("resolving {addr}"))?
        .next()
        .with_context(|| format!("{addr} resolves to nothing"))?;
    let mut stream = TcpStream::connect_timeout(&socket, Duration::from_secs(5))
        .with_context(|| format!("connecting to the master's metrics at {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let url = format!("http://{addr}{path}");
    let mut data = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let (head_len, body_len) = loop {
        let n = stream
            .read(&mut buf)
            .with_context(|| format!("reading {url}"))?;
        if n == 0 {
            bail!("{url}: the connection closed before the HTTP header ended");
        }
        data.extend_from_slice(&buf[..n]);
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).into_owned();
            if !(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200")) {
                bail!("{url} answered {}", head.lines().next().unwrap_or(""));
            }
            let length = head.lines().find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.trim()
                    .eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())
                    .flatten()
            });
            break (end + 4, length);
        }
    };
    match body_len {
        Some(len) => {
            while data.len() < head_len + len {
                let n = stream
                    .read(&mut buf)
                    .with_context(|| format!("reading {url}"))?;
                if n == 0 {
                    bail!(
                        "{url}: the body ended after {} of {len} bytes",
                        data.len() - head_len
                    );
                }
                data.extend_from_slice(&buf[..n]);
            }
            data.truncate(head_len + len);
        }
        None => {
            stream
                .read_to_end(&mut data)
                .with_context(|| format!("reading {url}"))?;
        }
    }
    Ok(String::from_utf8_lossy(&data[head_len..]).into_owned())
}

/// Blocks to write: their store keys, and when the prefill that produced them ended.
#[derive(Debug)]
pub struct PutBatch {
    /// Store keys, every namespace of every block.
    pub keys: Vec<String>,
    /// When the request's modelled prefill ended.
    pub at: Instant,
}

/// What the writer did over a run.
#[derive(Debug)]
pub struct WriterStats {
    /// Keys the Python client stored (`put` returned 0).
    pub keys_written: u64,
    /// Keys whose `put` failed (the writer answers the first error code of a line;
    /// the whole line counts as failed).
    pub put_errors: u64,
    /// From the end of a prefill to the Python client's answer for its blocks, µs.
    pub lag_us: Histogram<u64>,
    /// Why the writer stopped early, if it did.
    pub failure: Option<String>,
}

/// The Python store client, fed [`PutBatch`]es through a channel by a thread of its
/// own, so that puts never stall the engines.
#[derive(Debug)]
pub struct Writer {
    tx: Option<mpsc::Sender<PutBatch>>,
    thread: Option<JoinHandle<WriterStats>>,
    log: PathBuf,
}

impl Writer {
    /// Starts `writer.py` with `python` against the master at `addr` and waits for its
    /// `ready`.
    ///
    /// # Errors
    /// The interpreter or script is missing, or setup fails (with the end of its log).
    pub fn start(python: &Path, addr: &str, log_dir: &Path) -> anyhow::Result<Self> {
        let script = mooncake_peers::writer_script();
        if !python.is_file() {
            bail!(
                "the Mooncake Python client's interpreter not found at {}: {INSTALL_HINT}",
                python.display()
            );
        }
        static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = log_dir.join(format!("mooncake-writer-{n}.log"));
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = Command::new(python)
            .arg(&script)
            .arg(addr)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("cannot run {}: {INSTALL_HINT}", script.display()))?;
        let stdin = child.stdin.take().context("writer stdin")?;
        let stdout = child.stdout.take().context("writer stdout")?;
        let (answer_tx, answers) = mpsc::channel();
        // A thread owns the pipe so that every wait has a deadline.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if answer_tx.send(line).is_err() {
                    break;
                }
            }
        });
        match answers.recv_timeout(WRITER_ANSWER) {
            Ok(line) if line == "ready" => {}
            other => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "writer.py setup failed ({other:?}); its log ends:\n{}",
                    tail(&log)
                );
            }
        }
        let (tx, batches) = mpsc::channel();
        let thread_log = log.clone();
        let thread = std::thread::Builder::new()
            .name("mooncake-writer".to_owned())
            .spawn(move || write_loop(child, stdin, &answers, &batches, &thread_log))
            .context("starting the writer thread")?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            log,
        })
    }

    /// A handle engines send batches through.
    #[must_use]
    pub fn sender(&self) -> Option<mpsc::Sender<PutBatch>> {
        self.tx.clone()
    }

    /// Waits until every batch sent so far (and by every [`sender`](Self::sender),
    /// once all are dropped) is written, stops the Python client and returns what it
    /// did.
    ///
    /// # Errors
    /// The writer thread panicked.
    pub fn finish(mut self) -> anyhow::Result<WriterStats> {
        drop(self.tx.take());
        let thread = self.thread.take().context("writer already finished")?;
        thread
            .join()
            .map_err(|_| anyhow::anyhow!("the writer thread panicked"))
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The writer thread: one `put` line per 500 keys, one answer per line.
fn write_loop(
    mut child: Child,
    mut stdin: ChildStdin,
    answers: &mpsc::Receiver<String>,
    batches: &mpsc::Receiver<PutBatch>,
    log: &Path,
) -> WriterStats {
    let mut stats = WriterStats {
        keys_written: 0,
        put_errors: 0,
        lag_us: Histogram::new(3).expect("3 significant digits is a valid histogram"),
        failure: None,
    };
    'batches: while let Ok(batch) = batches.recv() {
        if stats.failure.is_some() {
            stats.put_errors += batch.keys.len() as u64;
            continue;
        }
        for chunk in batch.keys.chunks(KEYS_PER_LINE) {
            let line = format!("put {}\n", chunk.join(" "));
            if let Err(e) = stdin
                .write_all(line.as_bytes())
                .and_then(|()| stdin.flush())
            {
                stats.failure = Some(format!(
                    "writer.py stdin: {e}; its log ends:\n{}",
                    tail(log)
                ));
                stats.put_errors += batch.keys.len() as u64;
                continue 'batches;
            }
            match answers.recv_timeout(WRITER_ANSWER) {
                Ok(answer) if answer == format!("ok {}", chunk.len()) => {
                    stats.keys_written += chunk.len() as u64;
                }
                Ok(answer) if answer.starts_with("err ") => {
                    stats.put_errors += chunk.len() as u64;
                }
                other => {
                    stats.failure = Some(format!(
                        "writer.py answered {other:?} to a put; its log ends:\n{}",
                        tail(log)
                    ));
                    stats.put_errors += chunk.len() as u64;
                    continue 'batches;
                }
            }
        }
        let lag = batch.at.elapsed();
        let _ = stats
            .lag_us
            .record(u64::try_from(lag.as_micros()).unwrap_or(u64::MAX).max(1));
    }
    // Killing is enough: the run is over, and a polite close takes 1-2 s.
    let _ = child.kill();
    let _ = child.wait();
    stats
}
