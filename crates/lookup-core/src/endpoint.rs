//! Where the lookup channel lives (`spec/wire.md`, "Transport"): a ZeroMQ URL, or
//! vLLM's ipc path from its parts. A name only: binding and connecting are the
//! drivers' (`lookup-server`, `lookup-tokio`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::Error;

/// A lookup channel endpoint (`spec/wire.md`, "Transport"): `ipc://PATH` or
/// `tcp://HOST:PORT`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// A Unix socket file.
    Ipc(PathBuf),
    /// A TCP address, `host:port` (for example `127.0.0.1:5555`).
    Tcp(String),
}

impl Endpoint {
    /// vLLM's endpoint for a MooncakeStoreConnector worker:
    /// `ipc://{base}/lookup_rpc_port_{lookup_rpc_port}_host_{hostname}_dp_rank{dp_rank}`.
    /// `base` is `VLLM_RPC_BASE_PATH`; `None` means the temp dir (`/tmp` unless
    /// `TMPDIR` says otherwise), vLLM's default. `lookup_rpc_port` is the
    /// `kv_connector_extra_config` value of that name (0 when absent: a name, not a
    /// TCP port); `dp_rank` is the data-parallel index.
    #[must_use]
    pub fn vllm(base: Option<&Path>, lookup_rpc_port: u32, hostname: &str, dp_rank: u32) -> Self {
        let base = base.map_or_else(std::env::temp_dir, Path::to_path_buf);
        Self::Ipc(base.join(format!(
            "lookup_rpc_port_{lookup_rpc_port}_host_{hostname}_dp_rank{dp_rank}"
        )))
    }

    /// The ZeroMQ URL (`ipc://...` or `tcp://...`).
    #[must_use]
    pub fn url(&self) -> String {
        self.to_string()
    }

    /// The socket file of an ipc endpoint.
    #[must_use]
    pub fn ipc_path(&self) -> Option<&Path> {
        match self {
            Self::Ipc(p) => Some(p),
            Self::Tcp(_) => None,
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ipc(p) => write!(f, "ipc://{}", p.display()),
            Self::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

impl FromStr for Endpoint {
    type Err = Error;

    /// Parses `ipc://PATH` or `tcp://HOST:PORT`.
    ///
    /// # Errors
    /// [`Error::Endpoint`] for another scheme, an empty path, or a TCP address
    /// without a numeric port.
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = |why: &str| Error::Endpoint {
            endpoint: s.to_owned(),
            why: why.to_owned(),
        };
        if let Some(path) = s.strip_prefix("ipc://") {
            if path.is_empty() {
                return Err(bad("empty ipc path"));
            }
            return Ok(Self::Ipc(PathBuf::from(path)));
        }
        if let Some(addr) = s.strip_prefix("tcp://") {
            let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("missing :PORT"))?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad("expected tcp://HOST:PORT with a port in 0-65535"));
            }
            return Ok(Self::Tcp(addr.to_owned()));
        }
        Err(bad("expected ipc://PATH or tcp://HOST:PORT"))
    }
}
