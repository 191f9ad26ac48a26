//! The scheduler-side prefix-cache lookup as a sans-IO state machine.
//!
//! An LLM serving scheduler must know, per request, how many leading prompt tokens
//! already have KV blocks in an external store (Mooncake Store), so that it loads them
//! instead of recomputing. The answer comes from an RPC. This crate decides *when*
//! that RPC is sent, shared, prioritised, cancelled, timed out and trusted, following
//! `spec/behaviour.md` (vLLM #45659 and its prefetch follow-up, plus rules of ours),
//! without doing any I/O: no runtime, no sockets, no threads, no clock reads. The
//! caller passes `now` into every call and carries [`Command`]s to the wire.
//!
//! - [`Lookups`]: the request lifecycle (arrival, probe, allocation, finish,
//!   preemption, reset, close) and the RPC bookkeeping (replies, failures, timeouts).
//! - [`Dispatcher`]: the send queue a driver keeps next to its socket: priority,
//!   `max_in_flight`, cancellation of lookups not sent yet.
//! - [`wire`]: both vLLM wire formats of `spec/wire.md`, client and server side.
//! - [`answer`]: what a lookup's answer is (blocks to check, leading run, hit tokens),
//!   shared by the server and by a client that asks the store itself.
//! - [`Endpoint`]: where the lookup channel lives (`spec/wire.md`, "Transport").
//!
//! # Driving loop
//!
//! After every input, drain [`Lookups::poll_transmit`] into the [`Dispatcher`], send
//! what it releases, drain [`Lookups::poll_event`], then re-read
//! [`Lookups::poll_timeout`]. A runnable version with a fake server that answers at once:
//!
//! ```
//! use std::time::{Duration, Instant};
//! use lookup_core::{BlockHashes, Config, Dispatcher, Lookups, Probe, Request, RequestId, RpcBody, Reply};
//!
//! let mut config = Config::new(16);
//! config.lookup_async = true;
//! config.lookup_prefetch_limit = 4;
//! let mut lookups = Lookups::new(config.clone()).unwrap();
//! let mut dispatcher = Dispatcher::new(&config);
//! let now = Instant::now();
//!
//! let req = Request {
//!     request_id: RequestId(7),
//!     num_tokens: 48,
//!     block_hashes: BlockHashes::from_u64s(&[1, 2, 3]),
//!     skip_reading_external_kv: false,
//! };
//! lookups.on_new_request(&req, now); // prefetch: the lookup starts at arrival
//! while let Some(cmd) = lookups.poll_transmit() {
//!     dispatcher.push(cmd);
//! }
//! let sent = dispatcher.next_send().unwrap(); // the driver writes it to its socket
//! lookups.handle_sent(sent.rpc_id, now);
//! assert!(matches!(sent.body, RpcBody::Lookup { num_tokens: 48, .. }));
//!
//! // The server says the first two blocks (32 tokens) are stored.
//! let later = now + Duration::from_millis(1);
//! dispatcher.on_done(sent.rpc_id);
//! lookups.handle_reply(sent.rpc_id, Reply::Lookup { hit_tokens: 32 }, later);
//! while let Some(_event) = lookups.poll_event() {}
//!
//! // The scheduler probes with a local (GPU) hit of 16 tokens: 16 more to load.
//! let probe = lookups.probe(&req, 16, later);
//! assert_eq!(probe, Probe::Ready { external_tokens: 16, load_async: true });
//! lookups.on_allocated(req.request_id); // consumed
//! assert_eq!(lookups.slots_in_use(), 0);
//! ```
#![forbid(unsafe_code)]

pub mod answer;
mod config;
mod dispatch;
mod endpoint;
mod error;
mod hashes;
mod lookups;
mod types;
pub mod wire;

pub use config::Config;
pub use dispatch::{Dispatcher, Outgoing};
pub use endpoint::Endpoint;
pub use error::Error;
pub use hashes::BlockHashes;
pub use lookups::Lookups;
pub use types::*;
