//! The settings `probe` and `doctor` share with the client: where the server or the
//! master is, the prompt (token count and block hashes), and the store-key layout.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use lookup_core::{BlockHashes, Endpoint};
use lookup_server::mooncake_master::{KeyLayout, MasterAddr, MasterConfig, RankNamespace};

use crate::Failure;

/// Where the server is: a URL, or vLLM's ipc path from its parts (`spec/wire.md`).
#[derive(Args, Debug)]
pub(crate) struct Target {
    /// `ipc://PATH` or `tcp://HOST:PORT`.
    #[arg(long, conflicts_with_all = ["base_path", "lookup_rpc_port", "hostname", "dp_rank"])]
    pub(crate) endpoint: Option<String>,
    /// vLLM's `VLLM_RPC_BASE_PATH` (default: the temp dir).
    #[arg(long)]
    pub(crate) base_path: Option<PathBuf>,
    /// `lookup_rpc_port` of `kv_connector_extra_config` (a name, not a TCP port).
    #[arg(long)]
    pub(crate) lookup_rpc_port: Option<u32>,
    /// Host name in the path (default: this machine's).
    #[arg(long)]
    pub(crate) hostname: Option<String>,
    /// Data-parallel rank.
    #[arg(long)]
    pub(crate) dp_rank: Option<u32>,
    /// Seconds to wait for the reply (with --mooncake-master: for the connect, the
    /// etcd read and each master call).
    #[arg(long, default_value_t = 5.0)]
    pub(crate) timeout_s: f64,
}

impl Target {
    /// The endpoint: `--endpoint`, or vLLM's ipc path from the parts.
    pub(crate) fn endpoint(&self) -> Result<Endpoint, Failure> {
        if let Some(url) = &self.endpoint {
            return url
                .parse()
                .map_err(|e: lookup_core::Error| Failure::usage(e.to_string()));
        }
        let Some(port) = self.lookup_rpc_port else {
            return Err(Failure::usage(
                "give --endpoint URL, or vLLM's parts (--lookup-rpc-port, and optionally --base-path, --hostname, --dp-rank), or --mooncake-master ADDR",
            ));
        };
        let hostname = match &self.hostname {
            Some(h) => h.clone(),
            None => local_hostname().ok_or_else(|| {
                Failure::usage("cannot read this machine's host name; give --hostname")
            })?,
        };
        Ok(Endpoint::vllm(
            self.base_path.as_deref(),
            port,
            &hostname,
            self.dp_rank.unwrap_or(0),
        ))
    }

    /// `--timeout-s` as a duration: positive and finite (at most one hour).
    pub(crate) fn timeout(&self) -> Result<Duration, Failure> {
        if self.timeout_s.is_finite() && self.timeout_s > 0.0 && self.timeout_s <= 3600.0 {
            Ok(Duration::from_secs_f64(self.timeout_s))
        } else {
            Err(Failure::usage(format!(
                "--timeout-s {} is not a number of seconds above 0 and at most 3600",
                self.timeout_s
            )))
        }
    }
}

/// The prompt: its token count and its block hashes.
#[derive(Args, Debug)]
pub(crate) struct Prompt {
    /// The prompt's token count (unaligned).
    #[arg(long)]
    pub(crate) num_tokens: u32,
    /// Block hashes in order, hex, comma-separated (all of one length).
    #[arg(long, value_delimiter = ',', conflicts_with = "hashes_file")]
    pub(crate) hashes: Vec<String>,
    /// A file of block hashes, one hex hash a line (blank lines and `#` comments skipped).
    #[arg(long)]
    pub(crate) hashes_file: Option<PathBuf>,
    /// Lookup alignment in tokens (`msgpack-hex` floors the token count to it; the
    /// reply's hit must be a multiple of it).
    #[arg(long, default_value_t = 16)]
    pub(crate) block_size: u32,
}

impl Prompt {
    /// The block hashes of `--hashes` or `--hashes-file`, after checking the block size.
    pub(crate) fn block_hashes(&self) -> Result<BlockHashes, Failure> {
        if self.block_size == 0 {
            return Err(Failure::usage("--block-size must be at least 1"));
        }
        let hashes = match &self.hashes_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| Failure::usage(format!("cannot read {}: {e}", path.display())))?;
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_owned)
                    .collect()
            }
            None => self.hashes.clone(),
        };
        parse_hashes(&hashes)
    }
}

/// The Mooncake master to ask directly, and how block hashes become its keys (the
/// lookup server's and the direct transport's settings: `spec/wire.md`, "What the
/// server computes", step 2).
#[derive(Args, Debug)]
pub(crate) struct Master {
    /// Ask the Mooncake master at HOST:PORT (its --rpc_port), or the leader of a
    /// high-availability cluster at etcd://H1:P1;H2:P2, instead of a lookup server.
    /// Every present key gets a read lease on the master, as with vLLM's worker.
    #[arg(
        long,
        value_name = "HOST:PORT|etcd://H:P;...",
        conflicts_with_all = ["endpoint", "base_path", "lookup_rpc_port", "hostname", "dp_rank"]
    )]
    pub(crate) mooncake_master: Option<String>,
    /// Cluster id of an etcd:// master address (the masters' -cluster_id); default
    /// $MC_STORE_CLUSTER_ID, else mooncake_cluster.
    #[arg(long, value_name = "ID", requires = "mooncake_master")]
    pub(crate) mooncake_cluster_id: Option<String>,
    /// The tenant_id argument of the master's existence calls.
    #[arg(long, default_value = "default")]
    pub(crate) tenant_id: String,
    /// Model name in the store keys, as the writers use it.
    #[arg(long, default_value = "model")]
    pub(crate) model: String,
    /// Optional cache prefix in front of every store key.
    #[arg(long)]
    pub(crate) cache_prefix: Option<String>,
    /// Tensor-parallel ranks: one key namespace each.
    #[arg(long, default_value_t = 1)]
    pub(crate) tp_size: u32,
    /// Pipeline-parallel ranks: one key namespace each (times --tp-size).
    #[arg(long, default_value_t = 1)]
    pub(crate) pp_size: u32,
    /// Decode context-parallel size (vLLM's --decode-context-parallel-size): it
    /// subdivides TP, so it must divide --tp-size; TP rank t writes `dcp{t % size}`.
    #[arg(long, default_value_t = 1)]
    pub(crate) dcp_size: u32,
    /// Prefill context-parallel ranks (vLLM's --prefill-context-parallel-size): one
    /// key namespace each (times --tp-size and --pp-size).
    #[arg(long, default_value_t = 1)]
    pub(crate) pcp_size: u32,
}

impl Master {
    /// The key layout of `--model`, `--cache-prefix` and the rank sizes.
    pub(crate) fn layout(&self) -> Result<KeyLayout, Failure> {
        layout_of(&self.model, self.cache_prefix.as_deref(), self.sizes())
    }

    /// The rank sizes of the flags.
    pub(crate) fn sizes(&self) -> RankSizes {
        RankSizes {
            tp: self.tp_size,
            pp: self.pp_size,
            dcp: self.dcp_size,
            pcp: self.pcp_size,
        }
    }

    /// The master client's settings: every wait bounded by `timeout`.
    /// `addr` (the `--mooncake-master` value) as the client parses it, with
    /// `--mooncake-cluster-id`.
    ///
    /// # Errors
    /// A malformed address or cluster id: a usage error (exit 2), never an
    /// unavailable master.
    pub(crate) fn parse_addr(&self, addr: &str) -> Result<MasterAddr, Failure> {
        MasterAddr::parse(addr, self.mooncake_cluster_id.as_deref())
            .map_err(|e| Failure::usage(format!("--mooncake-master: {e}")))
    }

    pub(crate) fn config(&self, timeout: Duration) -> MasterConfig {
        let mut config = MasterConfig::default();
        config.call_timeout = timeout;
        config.connect_timeout = timeout;
        config.etcd_timeout = timeout;
        config.tenant_id.clone_from(&self.tenant_id);
        config.cluster_id.clone_from(&self.mooncake_cluster_id);
        config
    }
}

/// The parallel sizes that decide a layout's rank namespaces (each at least 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RankSizes {
    pub(crate) tp: u32,
    pub(crate) pp: u32,
    pub(crate) dcp: u32,
    pub(crate) pcp: u32,
}

impl RankSizes {
    /// The namespaces vLLM 0.33's lookup asks for a full-attention model whose TP
    /// ranks each hold distinct heads (`_init_lookup_key_prefixes`): pcp-major, then
    /// tp, then pp; with DCP each TP rank's `dcp_rank` is `tp_rank % dcp_size`.
    ///
    /// # Errors
    /// A usage failure for a size of 0 or a DCP size that does not divide the TP size.
    pub(crate) fn namespaces(self) -> Result<Vec<RankNamespace>, Failure> {
        for (flag, size) in [
            ("--tp-size", self.tp),
            ("--pp-size", self.pp),
            ("--dcp-size", self.dcp),
            ("--pcp-size", self.pcp),
        ] {
            if size == 0 {
                return Err(Failure::usage(format!("{flag} must be at least 1")));
            }
        }
        if self.tp % self.dcp != 0 {
            return Err(Failure::usage(format!(
                "--dcp-size {} does not divide --tp-size {} (decode context parallelism \
                 subdivides the TP ranks)",
                self.dcp, self.tp
            )));
        }
        let mut out = Vec::new();
        for pcp_rank in 0..self.pcp {
            for tp_rank in 0..self.tp {
                for pp_rank in 0..self.pp {
                    out.push(RankNamespace {
                        tp_rank,
                        pcp_rank,
                        dcp_rank: tp_rank % self.dcp,
                        pp_rank,
                        group: 0,
                    });
                }
            }
        }
        Ok(out)
    }

    /// The flags that give these sizes (`--tp-size 2 --dcp-size 2`), sizes of 1 other
    /// than TP and PP left out.
    pub(crate) fn flags(self) -> String {
        let mut out = format!("--tp-size {} --pp-size {}", self.tp, self.pp);
        if self.dcp > 1 {
            out.push_str(&format!(" --dcp-size {}", self.dcp));
        }
        if self.pcp > 1 {
            out.push_str(&format!(" --pcp-size {}", self.pcp));
        }
        out
    }
}

/// A key layout: `model`, an optional cache prefix, the namespaces of `sizes`.
pub(crate) fn layout_of(
    model: &str,
    cache_prefix: Option<&str>,
    sizes: RankSizes,
) -> Result<KeyLayout, Failure> {
    KeyLayout::new(model)
        .with_cache_prefix(cache_prefix.map(str::to_owned))
        .with_namespaces(sizes.namespaces()?)
        .map_err(|e| Failure::usage(e.to_string()))
}

/// This machine's host name, as Python's `socket.gethostname()` gives it to vLLM.
fn local_hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

/// Hex hashes, all of one length, to [`BlockHashes`].
fn parse_hashes(hashes: &[String]) -> Result<BlockHashes, Failure> {
    let decoded = hashes
        .iter()
        .enumerate()
        .map(|(i, h)| {
            decode_hex(h.trim())
                .ok_or_else(|| Failure::usage(format!("hash {i} `{h}` is not hex of even length")))
        })
        .collect::<Result<Vec<Vec<u8>>, Failure>>()?;
    BlockHashes::from_hashes(&decoded).map_err(|e| Failure::usage(format!("bad hashes: {e}")))
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    let s = s.strip_prefix("0x").unwrap_or(s);
    if s.is_empty() || s.len() % 2 != 0 {
        return None;
    }
    s.as_bytes()
        .chunks_exact(2)
        .map(|pair| {
            let digit = |c: u8| char::from(c).to_digit(16);
            u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()
        })
        .collect()
}
