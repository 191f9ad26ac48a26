//! `lookup probe --mooncake-master ADDR`: one lookup asked of the Mooncake master
//! itself, computed as the client's direct transport computes it (the store keys of
//! the blocks to check with the server's [`KeyLayout`], one leading-run
//! `BatchExistKey` query chunked with an early stop, the hit from lookup-core's
//! answer rules: `spec/wire.md`, "What the server computes").

use std::time::{Duration, Instant};

use lookup_core::BlockHashes;
use lookup_core::answer::{blocks_to_check, hit_tokens};
use lookup_server::mooncake_master::{KeyLayout, MasterClient, MasterError};

use crate::args::{Master, Prompt, Target};
use crate::{EXIT_FAILED, Failure};

/// What one lookup asked of the master found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// `hit_tokens` leading tokens are stored (more than 0).
    Hit(u32),
    /// None of the prompt is stored.
    Miss,
    /// No full block: nothing was asked.
    NotNeeded,
}

impl Found {
    /// The hit tokens (0 for a miss or nothing to ask).
    pub(crate) fn hit_tokens(self) -> u32 {
        match self {
            Self::Hit(hit) => hit,
            Self::Miss | Self::NotNeeded => 0,
        }
    }

    /// The outcome as printed (`hit`, `miss`, `not needed (...)`).
    pub(crate) fn outcome(self) -> &'static str {
        match self {
            Self::Hit(_) => "hit",
            Self::Miss => "miss",
            Self::NotNeeded => "not needed (no full block to ask about)",
        }
    }
}

/// Asks `master` for the leading run of the prompt's blocks under `layout`, as the
/// direct transport does. A key the master answers with an `ErrorCode` ends the run
/// at its block (vLLM's worker counts only `1`s).
///
/// # Errors
/// The master client's errors: unavailable, connection lost, timed out, malformed.
pub(crate) async fn ask(
    master: &MasterClient,
    layout: &KeyLayout,
    prompt: &Prompt,
    block_hashes: &BlockHashes,
) -> Result<Found, MasterError> {
    let blocks = blocks_to_check(prompt.num_tokens, prompt.block_size, block_hashes.len());
    if blocks == 0 {
        return Ok(Found::NotNeeded);
    }
    let keys = layout.chain_keys(block_hashes, blocks);
    let keys_per_block = layout.namespaces().len().max(1);
    let run = match master.leading_blocks_flat(&keys, keys_per_block).await {
        Ok(run) => run,
        Err(MasterError::Store {
            key_index: Some(i), ..
        }) => i / keys_per_block,
        Err(error) => return Err(error),
    };
    match hit_tokens(prompt.num_tokens, prompt.block_size, run.min(blocks)) {
        0 => Ok(Found::Miss),
        hit => Ok(Found::Hit(hit)),
    }
}

/// Connects to the master at `addr` (`host:port` or `etcd://...`) with every wait
/// bounded by `timeout`, and reports how long the connect took.
///
/// # Errors
/// [`MasterClient::connect`]'s: a bad address, no etcd answer, no leader, refused.
pub(crate) async fn connect(
    addr: &str,
    settings: &Master,
    timeout: Duration,
) -> Result<(MasterClient, Duration), MasterError> {
    let started = Instant::now();
    let client = MasterClient::connect(addr, settings.config(timeout)).await?;
    Ok((client, started.elapsed()))
}

/// `lookup probe --mooncake-master ADDR`: prints `hit_tokens`, `outcome`, the keys
/// asked, the leader (for `etcd://`) and the round trip of the query. An unavailable
/// master prints `outcome: unavailable: CAUSE` and no `hit_tokens` line: it answered
/// nothing, and a 0 would read as a miss.
pub(crate) async fn probe(
    addr: &str,
    settings: &Master,
    prompt: &Prompt,
    block_hashes: &BlockHashes,
    target: &Target,
) -> Result<(), Failure> {
    settings.parse_addr(addr)?;
    let layout = settings.layout()?;
    let timeout = target.timeout()?;
    let unavailable = |error: &MasterError| {
        println!("outcome: unavailable: {error}");
        Failure {
            code: EXIT_FAILED,
            message: format!("the Mooncake master at {addr} is unavailable: {error}"),
        }
    };
    let (master, _) = connect(addr, settings, timeout)
        .await
        .map_err(|e| unavailable(&e))?;
    let started = Instant::now();
    let found = ask(&master, &layout, prompt, block_hashes)
        .await
        .map_err(|e| unavailable(&e))?;
    let round_trip = started.elapsed();
    println!("hit_tokens: {}", found.hit_tokens());
    println!("outcome: {}", found.outcome());
    println!("keys_asked: {}", master.stats().keys_asked);
    if let Some(leader) = master.leader() {
        println!("leader: {} (view {})", leader.leader, leader.version);
    }
    println!("round_trip_ms: {:.3}", round_trip.as_secs_f64() * 1e3);
    Ok(())
}
