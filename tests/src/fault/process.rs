//! Readers of this process's resident memory, threads and file descriptors.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lookup_tokio::Endpoint;

/// This thread's time on a CPU and time runnable but waiting for one
/// (`/proc/thread-self/schedstat`).
pub fn schedstat() -> (Duration, Duration) {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let mut fields = text
        .split_whitespace()
        .map(|f| Duration::from_nanos(f.parse().unwrap_or(0)));
    (
        fields.next().unwrap_or_default(),
        fields.next().unwrap_or_default(),
    )
}

/// A `kB` field of `/proc/<pid>/status` (for example `VmRSS`, `VmHWM`), or `Threads`.
pub fn status_field(pid: Option<u32>, field: &str) -> u64 {
    let path = pid.map_or_else(
        || "/proc/self/status".to_owned(),
        |p| format!("/proc/{p}/status"),
    );
    let status = std::fs::read_to_string(path).expect("read /proc status");
    status
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix(field)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no {field} in /proc status"))
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

/// Open socket descriptors of this process.
pub fn open_sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// A directory of its own under the temp dir, removed on drop.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    /// A fresh directory for test `tag` (the process id and a counter make it unique).
    pub fn new(tag: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("lkf-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    /// The directory.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }

    /// An ipc endpoint for a socket file `name` in the directory.
    pub fn ipc(&self, name: &str) -> Endpoint {
        Endpoint::Ipc(self.0.join(name))
    }

    /// Names of the entries in the directory, sorted.
    pub fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The client tests' own: one way to find a free port.
pub use crate::client::free_tcp;

/// Serialises the tests of one binary: caller-time figures of tests that share two
/// cores with each other would measure each other. Async, as it is held across awaits.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}
