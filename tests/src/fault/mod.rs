//! Shared pieces of the fault-injection, load and fuzz tests (RELIABILITY.md):
//!
//! - a workload in which every request's chain has its own known hit, so that an
//!   answer applied to the wrong (request, num_tokens, chain) shows;
//! - [`ChainIndex`], a `BlockIndex` that answers that workload from the hashes alone
//!   (no memory per key) and can hang on chosen chains;
//! - [`FaultServer`], an in-test ROUTER that answers the workload with scripted
//!   delays, duplicates, holds and drops;
//! - [`Harness`], a scheduler's view of a `LookupClient` that times every handle call
//!   and checks every answer against the outcome of the RPC that produced it;
//! - [`ChildServer`], a `LookupServer` in a child process (this test binary run again),
//!   to kill it for real or to keep its memory out of the client's;
//! - readers of this process's resident memory, threads and file descriptors.

mod chain_index;
mod child;
mod fault_server;
mod harness;
mod process;
mod workload;

use std::time::Duration;

pub use chain_index::*;
pub use child::*;
pub use fault_server::*;
pub use harness::*;
pub use process::*;
pub use workload::*;

/// Block size of every fault and load test (tokens; vLLM's default).
pub const B: u32 = 16;
/// Hashes per chain.
pub const CHAIN_BLOCKS: u32 = 64;
/// Bytes per hash (sha256, as vLLM).
pub const HASH_LEN: usize = 32;
/// A handle call that takes longer than this blocked on the wire: every fault these
/// tests inject delays a reply by 20 ms or more, so a call that waited for one takes
/// at least that. 10 ms, not the 1 ms caller-time goal: that goal is measured by
/// `cargo xtask bench`, and a test on a loaded 2-core machine sees scheduling stalls
/// of a few ms that say nothing about blocking.
pub const CALL_BUDGET: Duration = Duration::from_millis(10);
/// Slack allowed on top of `lookup_timeout_s` for a lookup's time on the wire and
/// for the scheduler loop to see its end (a loaded 2-core machine, debug build).
pub const PENDING_SLACK: Duration = Duration::from_millis(100);
