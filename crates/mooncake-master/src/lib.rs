//! A Rust client for the Mooncake master's existence RPC, without Mooncake's C++
//! library (`spec/mooncake-master-rpc.md`).
//!
//! Mooncake Store's master answers "which of these keys exist" for every client
//! (`BatchExistKey`, what vLLM's worker asks through the C++ client's
//! `batch_is_exist`). This crate speaks that RPC directly: coro_rpc framing and the
//! subset of struct_pack the call needs.
//!
//! - [`codec`]: the pure wire format (no I/O): request and reply headers, the
//!   struct_pack subset, encoders and decoders for `BatchExistKey`, `ExistKey`,
//!   `ServiceReady` and `RemoveAll`, checked against bytes captured from the real
//!   client and master.
//! - [`MasterClient`]: the tokio client: one pipelined TCP connection shared by every
//!   clone, per-call timeouts, reconnect with backoff, the `tenant_id` signature with a
//!   fall-back for pre-0.3.12 masters, key lists chunked with an early stop for
//!   leading-run queries.
//! - [`addr`]: where the master is: a fixed `host:port`, or `etcd://h1:p1;h2:p2` for a
//!   high-availability cluster, whose leader the client finds in etcd (through its
//!   v3 JSON gateway) and follows across failovers.
//! - [`batch`]: lookups answered together: the union of their keys, deduplicated,
//!   chunked, with an early stop per lookup ([`Coalescer`]), and a presence cache
//!   backed by the master's read lease (on by default).
//! - [`MasterLookup`]: the one owner of the store's answer to a chain: the client,
//!   the batcher, the lease, the presence cache, rule 17 and the key layout behind one
//!   call, what the direct transport, the router's store check and lookup-server's
//!   index are adapters over.
//! - [`key`]: store keys of KV blocks as vLLM writes them (`spec/wire.md`):
//!   [`KeyLayout`] turns a chain of block hashes into the keys to ask about.
//!
//! Every positive answer grants the object a read lease on the master (10 s by
//! default), exactly as the C++ client's `batch_is_exist` does: probe once per lookup,
//! not in a loop.
#![forbid(unsafe_code)]

pub mod addr;
pub mod batch;
mod client;
pub mod codec;
pub mod counters;
mod error;
mod etcd;
pub mod key;
mod lookup;

pub use addr::{LeaderState, MasterAddr, MasterView};
pub use batch::{BatchConfig, BatchStats, Coalescer, PresenceCacheConfig};
pub use client::{DEFAULT_REOPEN_AFTER_TIMEOUTS, Epoch, MasterClient, MasterConfig, MasterStats};
pub use codec::{ExistResult, FunctionId, TypeLiteral};
pub use error::{MasterError, StoreErrorCode};
pub use key::{KeyLayout, RankNamespace};
pub use lookup::{ChainAnswer, LookupConfig, MasterLookup, Unanswered};
