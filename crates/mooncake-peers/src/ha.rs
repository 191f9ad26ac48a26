//! A real etcd and real `mooncake_master` processes in high-availability mode, for
//! the failover tests (`spec/mooncake-master-rpc.md`, "High availability").
//!
//! - [`Etcd`]: Debian's `etcd` on free loopback ports with its own data directory,
//!   killed on drop.
//! - [`HaCluster`]: an etcd and two masters electing their leader in it; the first
//!   one started is the leader once [`HaCluster::start`] returns, the second a
//!   standby.
//!
//! Both come from `scripts/mooncake/install.sh` (etcd-server from Debian, the pinned
//! wheel). A missing binary fails with a message naming that script.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{Master, free_port, tail};

/// Longest wait for etcd to answer its health check, in seconds (it takes ~0.5 s).
const ETCD_START_SECS: u64 = 15;
/// Longest wait for the first leader to serve, in seconds (5 s warm-up after winning).
const LEADER_START_SECS: u64 = 20;

const ETCD_HINT: &str = "install it with `bash scripts/mooncake/install.sh` \
    (Debian etcd-server), or point ETCD_BIN at an etcd binary";

/// The `etcd` to run: `$ETCD_BIN`, else `/usr/bin/etcd` (Debian's etcd-server).
///
/// # Errors
/// When the file does not exist: a message naming the install script.
pub fn find_etcd_bin() -> Result<PathBuf, String> {
    let bin =
        std::env::var_os("ETCD_BIN").map_or_else(|| PathBuf::from("/usr/bin/etcd"), PathBuf::from);
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("etcd not found at {}: {ETCD_HINT}", bin.display()))
    }
}

/// [`find_etcd_bin`] for a test.
///
/// # Panics
/// When the file does not exist, naming the install script.
pub fn etcd_bin() -> PathBuf {
    find_etcd_bin().unwrap_or_else(|e| panic!("{e}"))
}

/// One answer of a plain HTTP/1.1 exchange on loopback: the status line's code and
/// the body, or `None` when nothing answers.
pub fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut stream =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let code = answer.split_whitespace().nth(1)?.parse().ok()?;
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Some((code, body))
}

/// A running etcd on loopback, killed on drop (its data directory removed). It can be
/// stopped and started again on the same ports with the same data (an etcd outage).
pub struct Etcd {
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
    log: PathBuf,
    data: TempDir,
}

impl Etcd {
    /// Starts a single-member etcd on free loopback ports and waits until healthy.
    pub fn start() -> Self {
        let data = TempDir::new().expect("etcd data directory");
        let log = data.path().join("etcd.log");
        let mut etcd = Self {
            child: None,
            client_port: free_port(),
            peer_port: free_port(),
            log,
            data,
        };
        etcd.restart();
        etcd
    }

    /// Kills etcd (SIGKILL) and reaps it; its ports and data stay for
    /// [`restart`](Self::restart).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd (again) on its ports with its data directory and waits until
    /// healthy; a running one is left as it is.
    ///
    /// # Panics
    /// When etcd cannot run, exits, or is not healthy within 15 s (with its log's tail).
    pub fn restart(&mut self) {
        if self.child.is_some() {
            return;
        }
        let bin = etcd_bin();
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open etcd's log file");
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(&bin)
            .args(["--name", "test"])
            .arg("--data-dir")
            .arg(self.data.path().join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("test={peer}")])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("clone log handle"))
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}; {ETCD_HINT}", bin.display()));
        let child = self.child.insert(child);
        let deadline = Instant::now() + Duration::from_secs(ETCD_START_SECS);
        while !http(self.client_port, "GET", "/health", "")
            .is_some_and(|(code, body)| code == 200 && body.contains("\"health\":\"true\""))
        {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("etcd exited with {status}:\n{}", tail(&self.log));
            }
            assert!(
                Instant::now() < deadline,
                "etcd not healthy within {ETCD_START_SECS} s:\n{}",
                tail(&self.log)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `127.0.0.1:{client port}`, as masters take it (`-etcd_endpoints`).
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An etcd and two HA masters of one cluster id; dropped in reverse order.
pub struct HaCluster {
    /// The masters; [`leader`](Self::leader) says which one leads.
    pub masters: Vec<Master>,
    /// The cluster id the masters elect under (also `MC_STORE_CLUSTER_ID` for the
    /// Python writer).
    pub cluster_id: String,
    /// The cluster's etcd.
    pub etcd: Etcd,
}

impl HaCluster {
    /// Starts etcd, then master 0 and waits until it serves as leader (its 5 s
    /// warm-up), then master 1 as standby and waits until it sees master 0 as leader.
    /// `oplog` adds `-enable_oplog=true` (object metadata replicated through etcd).
    pub fn start(oplog: bool) -> Self {
        Self::start_with(oplog, &[])
    }

    /// As [`start`](Self::start), with `extra` flags for both masters (e.g.
    /// `-default_kv_lease_ttl=2000`).
    pub fn start_with(oplog: bool, extra: &[String]) -> Self {
        let etcd = Etcd::start();
        let cluster_id = format!("ha_test_{}_{}", std::process::id(), free_port());
        let flags = vec![
            "-enable_ha=true".to_owned(),
            format!("-etcd_endpoints={}", etcd.endpoint()),
            format!("-cluster_id={cluster_id}"),
            format!("-enable_oplog={oplog}"),
        ];
        let flags = [flags.as_slice(), extra].concat();
        let mut first = Master::spawn(free_port(), &flags);
        first.wait_ready(LEADER_START_SECS);
        let second = Master::spawn(free_port(), &flags);
        let cluster = Self {
            masters: vec![first, second],
            cluster_id,
            etcd,
        };
        let deadline = Instant::now() + Duration::from_secs(ETCD_START_SECS);
        while cluster.view_of(1).as_deref() != Some(cluster.masters[0].addr().as_str()) {
            assert!(
                Instant::now() < deadline,
                "the standby never saw the leader:\n{}",
                cluster.masters[1].log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        cluster
    }

    /// `etcd://127.0.0.1:{port}`, the clients' address of the cluster.
    pub fn addr(&self) -> String {
        format!("etcd://{}", self.etcd.endpoint())
    }

    /// The leader address master `i` reports on `GET /leader`, if it answers one.
    pub fn view_of(&self, i: usize) -> Option<String> {
        let (code, body) = http(self.masters[i].metrics_port(), "GET", "/leader", "")?;
        if code != 200 || !body.contains("\"present\":true") {
            return None;
        }
        let rest = body.split("\"leader_address\":\"").nth(1)?;
        Some(rest.split('"').next()?.to_owned())
    }

    /// The index of the master whose address etcd names, if any.
    pub fn leader(&self) -> Option<usize> {
        let named = (0..self.masters.len()).find_map(|i| self.view_of(i))?;
        self.masters.iter().position(|m| m.addr() == named)
    }

    /// Kills master `i` with SIGKILL (`kill -9`) and reaps it.
    pub fn kill(&mut self, i: usize) {
        self.masters[i].stop();
    }
}
