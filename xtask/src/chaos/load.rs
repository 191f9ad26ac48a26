//! The load of a chaos run: the prompts, the clients that look them up in a loop, and
//! the answers they record.
//!
//! Each client is a real [`LookupClient`] in sync mode (vLLM's default: a probe waits
//! for its answer, rule 10): a direct client to the master (its presence cache on or
//! off), or a ZeroMQ client of a `lookup-server --mooncake-master` process. Each
//! lookup is a new request of one prompt, probed with no local hit, so its answer
//! claims the prompt's first `external_tokens / block size` blocks.

use lookup_tokio::Deadline;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lookup_core::{BlockHashes, Probe, Request, RequestId};
use lookup_tokio::mooncake_master::MasterAddr;
use lookup_tokio::{ClientConfig, DirectConfig, Endpoint, KeyLayout, LookupClient};

/// Blocks per prompt.
pub const PROMPT_BLOCKS: u64 = 16;
/// vLLM block size of the run, tokens.
pub const BLOCK_SIZE: u32 = 16;

/// What a client is, as the table names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum ClientKind {
    /// A `LookupClient` on the direct transport to the master.
    Direct,
    /// A `LookupClient` over ZeroMQ to a `lookup-server --mooncake-master` process.
    Zmq,
}

impl ClientKind {
    /// The table's name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Zmq => "zmq",
        }
    }
}

/// One client of the run: its kind and whether the presence cache is on (its own for
/// a direct client, the server's for a ZeroMQ one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Client {
    /// Direct or ZeroMQ.
    pub kind: ClientKind,
    /// Presence cache on.
    pub cache: bool,
}

/// The prompts: `count` prompts of [`PROMPT_BLOCKS`] blocks, no block shared, with
/// their store keys under `layout`.
#[derive(Debug)]
pub struct Prompts {
    /// Block hashes of each prompt.
    pub hashes: Vec<BlockHashes>,
    /// Store keys of each prompt's blocks, in block order.
    pub keys: Vec<Vec<String>>,
}

impl Prompts {
    /// `count` prompts keyed by `layout`.
    #[must_use]
    pub fn new(count: usize, layout: &KeyLayout) -> Self {
        let hashes: Vec<BlockHashes> = (0..count as u64)
            .map(|p| {
                let ids: Vec<u64> = (0..PROMPT_BLOCKS)
                    .map(|b| 0xc4a0_0000 + p * 1_000 + b)
                    .collect();
                BlockHashes::from_u64s(&ids)
            })
            .collect();
        let keys = hashes
            .iter()
            .map(|h| layout.chain_keys(h, h.len()))
            .collect();
        Self { hashes, keys }
    }

    /// Every key of every prompt.
    #[must_use]
    pub fn all_keys(&self) -> Vec<String> {
        self.keys.iter().flatten().cloned().collect()
    }

    /// The keys of the second half of every prompt's blocks.
    #[must_use]
    pub fn tail_keys(&self) -> Vec<String> {
        let half = PROMPT_BLOCKS as usize / 2;
        self.keys.iter().flat_map(|k| k[half..].to_vec()).collect()
    }
}

/// One answered probe.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    /// Who answered.
    pub client: Client,
    /// The probe's start, from the run's start.
    pub started: Duration,
    /// The answer, from the run's start.
    pub at: Duration,
    /// The prompt asked about.
    pub prompt: usize,
    /// Leading blocks claimed stored.
    pub blocks: u32,
    /// The answer rested on an unavailable store (a 0 that is not a miss).
    pub unavailable: bool,
}

/// How a client reaches the store.
#[derive(Clone, Debug)]
pub enum Target {
    /// The master at this address (`host:port` or `etcd://h:p`), and the cluster id of
    /// an `etcd://` address.
    Direct(String, Option<String>),
    /// A lookup server at this ZeroMQ endpoint.
    Zmq(Endpoint),
}

/// The client settings every run shares.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// The masters' read lease (`-default_kv_lease_ttl`).
    pub lease: Duration,
    /// The clients' result TTL (`lookup_prefetch_ttl_s`).
    pub ttl: Duration,
    /// The clients' `lookup_timeout_s`.
    pub lookup_timeout: Duration,
    /// The clients' [`ClientConfig::wait_margin`]: a sync-mode probe waits at most
    /// `lookup_timeout_s` plus this.
    pub wait_margin: Duration,
    /// Pause between two lookups of one client.
    pub pause: Duration,
}

impl Settings {
    /// The longest a sync-mode probe may wait: `lookup_timeout_s` plus the wait
    /// margin ([`LookupClient::probe_until`]).
    #[must_use]
    pub fn probe_limit(&self) -> Duration {
        self.lookup_timeout + self.wait_margin
    }
}

/// Connects one client.
///
/// # Errors
/// The address or configuration is refused.
pub fn connect(
    client: Client,
    target: &Target,
    settings: &Settings,
) -> anyhow::Result<LookupClient> {
    let mut config = match target {
        Target::Direct(addr, cluster) => {
            let master = MasterAddr::parse(addr, cluster.as_deref())?;
            let mut direct = DirectConfig::new(master, KeyLayout::default());
            direct.lease_ttl = settings.lease;
            direct.batch.presence.enabled = client.cache;
            ClientConfig::new(direct, BLOCK_SIZE)
        }
        Target::Zmq(endpoint) => ClientConfig::zmq(endpoint.clone(), BLOCK_SIZE),
    };
    config.core.lookup_async = false;
    config.core.lookup_prefetch_ttl = settings.ttl;
    config.core.lookup_timeout = settings.lookup_timeout;
    config.wait_margin = settings.wait_margin;
    Ok(LookupClient::connect_lazy(config)?)
}

/// Looks up the prompts in turn until `stop`, from `first` on, and returns the
/// answers; times are from `epoch`.
pub async fn run_client(
    mut lookup: LookupClient,
    client: Client,
    prompts: Arc<Prompts>,
    first: usize,
    settings: Settings,
    epoch: Instant,
    stop: Arc<AtomicBool>,
) -> Vec<Answer> {
    let mut answers = Vec::new();
    let mut next_id = 0u64;
    let num_tokens = PROMPT_BLOCKS as u32 * BLOCK_SIZE + 1;
    while !stop.load(Ordering::Relaxed) {
        let prompt = (first + next_id as usize) % prompts.hashes.len();
        next_id += 1;
        let req = Request {
            request_id: RequestId(next_id),
            num_tokens,
            block_hashes: prompts.hashes[prompt].clone(),
            skip_reading_external_kv: false,
        };
        let started = epoch.elapsed();
        let probe = lookup.probe_until(&req, 0, Deadline::Answer).await;
        let at = epoch.elapsed();
        let blocks = match probe {
            Probe::Ready {
                external_tokens, ..
            } => external_tokens / BLOCK_SIZE,
            Probe::Pending => 0,
        };
        let unavailable = matches!(
            lookup.answer_of(req.request_id),
            Some(lookup_core::Answer::Unavailable(_))
        );
        lookup.on_finished(req.request_id);
        answers.push(Answer {
            client,
            started,
            at,
            prompt,
            blocks,
            unavailable,
        });
        tokio::time::sleep(settings.pause).await;
    }
    lookup.shutdown().await;
    answers
}
