//! What binding an endpoint takes beyond the socket: the loopback check of a TCP host,
//! and the ipc socket file (stale ones removed, live ones refused, the new one made
//! owner-only and unlinked when the server stops).

use std::fs;
use std::io;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use lookup_core::Endpoint;
use tmq::AsZmqSocket;

use crate::Error;

/// The host part of a `host:port` TCP address.
pub(crate) fn tcp_host(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(host, _)| host)
}

/// `host` without the brackets of an IPv6 literal.
pub(crate) fn bare_host(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// Whether a TCP host names the loopback interface: an IP literal in `127.0.0.0/8`
/// or `::1`, or `localhost`. Wildcards (`*`, `0.0.0.0`), interface names and other
/// host names are not.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    let host = bare_host(host);
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The endpoint the socket actually bound (the chosen port for port 0).
pub(crate) fn last_endpoint(socket: &tmq::router::Router) -> Option<Endpoint> {
    let url = socket.get_socket().get_last_endpoint().ok()?.ok()?;
    url.parse().ok()
}

/// Makes `path` ready for binding: creates a missing parent directory owner-only and
/// removes a stale socket file (one nobody accepts connections on, or any socket with
/// `take_over`). Anything else at the path is left alone and refused.
pub(crate) fn prepare_ipc_path(path: &Path, take_over: bool) -> Result<(), Error> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)?;
        }
    }
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if !take_over && std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(Error::EndpointInUse {
                    endpoint: format!("ipc://{}", path.display()),
                });
            }
            if remove_stale(path)? {
                tracing::info!(path = %path.display(), "removed a stale ipc socket file");
            }
            Ok(())
        }
        Ok(_) => Err(Error::InvalidServerConfig {
            key: "endpoint",
            why: format!("{} exists and is not a socket file", path.display()),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Unlinks the stale socket file at `path`; `Ok(false)` when it is gone already. The
/// server that made it may unlink it itself between the liveness check and this call
/// (it is shutting down: its `IpcFile` drops), which leaves the path free just the
/// same (the rebind race).
fn remove_stale(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The ipc socket file this server created, unlinked on drop only if it is still the
/// same file (same device and inode): a later server that took over the path keeps
/// its own.
#[derive(Debug)]
pub(crate) struct IpcFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl IpcFile {
    /// Records the file just bound and makes it owner-only.
    pub(crate) fn claim(path: &Path) -> Result<Self, Error> {
        fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
        let meta = fs::symlink_metadata(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

impl Drop for IpcFile {
    fn drop(&mut self) {
        if let Ok(meta) = fs::symlink_metadata(&self.path) {
            if meta.dev() == self.dev && meta.ino() == self.ino {
                if let Err(e) = fs::remove_file(&self.path) {
                    tracing::warn!(path = %self.path.display(), error = %e, "could not unlink the ipc socket file");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bug d (the rebind race): right after a server was dropped, its task unlinked
    /// the file between the liveness check and the removal, and the bind failed with
    /// `No such file or directory`. A file gone meanwhile is a free path.
    #[test]
    fn a_stale_file_unlinked_meanwhile_counts_as_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("lookup.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
        assert!(remove_stale(&path).expect("a stale file is removed"));
        assert!(!path.exists());
        // What the shutting-down server's unlink leaves behind for the second call.
        assert!(!remove_stale(&path).expect("NotFound is success"));
        // Anything else is still an error.
        let not_a_dir = dir.path().join("file");
        fs::write(&not_a_dir, b"x").expect("write");
        assert_eq!(
            remove_stale(&not_a_dir.join("lookup.sock"))
                .expect_err("ENOTDIR")
                .kind(),
            io::ErrorKind::NotADirectory
        );
    }

    #[test]
    fn loopback_hosts() {
        assert!(is_loopback_host("127.0.0.1"));
        assert!(is_loopback_host("127.1.2.3"));
        assert!(is_loopback_host("[::1]"));
        assert!(is_loopback_host("localhost"));
        assert!(!is_loopback_host("0.0.0.0"));
        assert!(!is_loopback_host("*"));
        assert!(!is_loopback_host("10.0.0.1"));
        assert!(!is_loopback_host("eth0"));
        assert!(!is_loopback_host("[::]"));
        assert_eq!(tcp_host("127.0.0.1:5555"), "127.0.0.1");
        assert_eq!(tcp_host("[::1]:5555"), "[::1]");
    }
}
