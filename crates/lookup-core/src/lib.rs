//! The scheduler-side prefix-cache lookup as a sans-IO state machine.
//!
//! An LLM serving scheduler must know, per request, how many leading prompt tokens
//! already have KV blocks in an external store (Mooncake Store), so that it loads them
//! instead of recomputing. The answer comes from an RPC. This crate decides *when*
//! that RPC is sent, shared, prioritised, cancelled, timed out and trusted, following
//! `spec/behaviour.md` (vLLM #45659 and its prefetch follow-up, plus rules of ours),
//! without doing any I/O: no runtime, no sockets, no threads, no clock reads. The
//! caller passes `now` into every call and carries [`Command`]s to the wire and
//! [`WireEvent`]s back.
//!
//! - [`Lookups`]: the request lifecycle (arrival, probe, allocation, finish,
//!   preemption, reset, close) and the RPC bookkeeping (replies, failures, timeouts).
//! - [`Dispatcher`]: the wire's half, kept by the driver next to its socket: send
//!   priority, `max_in_flight`, cancellation of lookups not sent yet, deadlines.
//! - [`wire`]: both vLLM wire formats of `spec/wire.md`, client and server side.
//! - [`answer`]: what a lookup's answer is (blocks to check, leading run, hit tokens),
//!   shared by the server and by a client that asks the store itself.
//! - [`Endpoint`]: where the lookup channel lives (`spec/wire.md`, "Transport").
//!
//! # Who owns what
//!
//! The protocol has two halves, each a sans-IO machine with one owner:
//!
//! - [`Lookups`] is the request lifecycle. It lives with the scheduler (on its thread,
//!   no lock) and owns every request's lookup, the RPCs' subscribers, the prefetch
//!   slots, the cached results and their TTL.
//! - [`Dispatcher`] is the wire. It lives with the socket, in the driver's I/O task,
//!   and owns the send queue, the RPCs on the wire, their deadlines (rule 17), the
//!   late-reply count and the reopen decision.
//!
//! What crosses between them are the core's own types: [`Command`]s one way,
//! [`WireEvent`]s the other. Each RPC's send-or-cancel race is settled by its
//! [`Ticket`].
//!
//! # Driving loop
//!
//! 1. Give the lifecycle an input (`on_new_request`, `probe`, `on_allocated`,
//!    `on_finished`, `on_preempted`, `reset`, `close`).
//! 2. Drain [`Lookups::poll_transmit`] into the [`Dispatcher`].
//! 3. Drain [`Dispatcher::poll_transmit`] and write each RPC to the wire.
//! 4. When a reply arrives, give it to [`Dispatcher::handle_reply`]; when
//!    [`Dispatcher::poll_timeout`] passes, call [`Dispatcher::handle_timeout`].
//! 5. Drain [`Dispatcher::poll_event`] into [`Lookups::handle_wire_event`].
//! 6. Drain [`Lookups::poll_event`].
//!
//! A runnable version with a fake server that answers at once:
//!
//! ```
//! use std::time::{Duration, Instant};
//! use lookup_core::{BlockHashes, Config, Dispatcher, Lookups, Probe, Request, RequestId, RpcBody, Reply};
//!
//! let mut config = Config::new(16);
//! config.lookup_async = true;
//! config.lookup_prefetch_limit = 4;
//! let mut lookups = Lookups::new(config.clone()).unwrap();
//! let mut dispatcher: Dispatcher = Dispatcher::new(&config);
//! let now = Instant::now();
//!
//! let req = Request {
//!     request_id: RequestId(7),
//!     num_tokens: 48,
//!     block_hashes: BlockHashes::from_u64s(&[1, 2, 3]),
//!     skip_reading_external_kv: false,
//! };
//! lookups.on_new_request(&req, now); // 1. prefetch: the lookup starts at arrival
//! while let Some(cmd) = lookups.poll_transmit() {
//!     dispatcher.push(cmd, (), now); // 2.
//! }
//! let sent = dispatcher.poll_transmit(now).unwrap(); // 3. the driver writes it
//! assert!(matches!(sent.body, RpcBody::Lookup { num_tokens: 48, .. }));
//!
//! // 4. The server says the first two blocks (32 tokens) are stored.
//! let later = now + Duration::from_millis(1);
//! assert!(dispatcher.handle_reply(sent.rpc_id, Reply::Lookup { hit_tokens: 32 }, later));
//! while let Some((event, ())) = dispatcher.poll_event() {
//!     lookups.handle_wire_event(event); // 5.
//! }
//! while let Some(_event) = lookups.poll_event() {} // 6.
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
pub mod settings;
pub mod timer;
mod types;
pub mod wire;

pub use config::{Config, OnPreemption, duration_from_secs};
pub use dispatch::{Dispatcher, DispatcherStats, Outgoing};
pub use endpoint::Endpoint;
pub use error::Error;
pub use hashes::BlockHashes;
pub use lookups::{Lookups, RETRY_BACKOFF_MAX, RETRY_BACKOFF_MIN, Table};
pub use types::*;
