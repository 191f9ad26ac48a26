//! A seeded fake wire on tokio's clock, in the spirit of str0m's netem: an in-process
//! lookup server whose replies arrive after a latency drawn per RPC, and which can
//! drop, duplicate or stall replies, refuse to open, or break the connection. Tests
//! run it under `tokio::time::pause`, so timeouts, backoff and reopen take no real
//! time and every run of a seed is the same.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lookup_core::{Outgoing, Reply, RpcBody, RpcId};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tracing::Span;

use super::peer::EndpointUnreachable;
use super::{SendError, Wire, WireInput};
use crate::clock;

/// How the fake server behaves; change it while a test runs through [`FakeWire::knobs`].
#[derive(Clone, Debug)]
pub(crate) struct Knobs {
    /// Reply latency, drawn uniformly from this range.
    pub(crate) latency: (Duration, Duration),
    /// Probability that a reply never comes.
    pub(crate) drop: f64,
    /// Probability that a reply comes twice.
    pub(crate) duplicate: f64,
    /// Hit tokens the server answers for a lookup of `num_tokens` tokens.
    pub(crate) hit: fn(u32) -> u32,
    /// While true, nothing is answered (a hung serial server).
    pub(crate) stalled: bool,
    /// Attempts to open a connection that still fail.
    pub(crate) open_failures: u32,
    /// False: the server is stopped, so the liveness check the task asks for after
    /// a timeout finds it silent (the wire then reports it down, once).
    pub(crate) alive: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            latency: (Duration::from_millis(1), Duration::from_millis(1)),
            drop: 0.0,
            duplicate: 0.0,
            hit: |_| 0,
            stalled: false,
            open_failures: 0,
            alive: true,
        }
    }
}

/// What the fake server saw, for assertions.
#[derive(Clone, Debug, Default)]
pub(crate) struct Record {
    /// Every RPC written, in order.
    pub(crate) sent: Vec<(RpcId, bool)>,
    /// Connections opened after the first.
    pub(crate) opens: u32,
    /// Failed open attempts, at their instants.
    pub(crate) open_failures_at: Vec<Instant>,
}

/// The fake wire.
pub(crate) struct FakeWire {
    rng: ChaCha8Rng,
    knobs: Arc<Mutex<Knobs>>,
    record: Arc<Mutex<Record>>,
    open: bool,
    /// Replies due, earliest first (ties by sequence).
    due: BTreeMap<(Instant, u64), (RpcId, Reply)>,
    seq: u64,
    /// Found stopped by a liveness check: writes fail fast.
    down: bool,
    /// An input to report before any reply.
    report: Option<WireInput<Reply>>,
}

impl FakeWire {
    /// A fake wire with `seed`; returns the knobs and the record to share with the test.
    pub(crate) fn new(seed: u64, knobs: Knobs) -> (Self, Arc<Mutex<Knobs>>, Arc<Mutex<Record>>) {
        let knobs = Arc::new(Mutex::new(knobs));
        let record = Arc::new(Mutex::new(Record::default()));
        let wire = Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            knobs: Arc::clone(&knobs),
            record: Arc::clone(&record),
            open: true,
            due: BTreeMap::new(),
            seq: 0,
            down: false,
            report: None,
        };
        (wire, knobs, record)
    }

    fn schedule(&mut self, at: Instant, rpc_id: RpcId, reply: Reply) {
        self.seq += 1;
        self.due.insert((at, self.seq), (rpc_id, reply));
    }
}

impl Wire for FakeWire {
    type Payload = Reply;

    fn name(&self) -> &str {
        "fake"
    }

    fn connecting(&self) -> bool {
        false
    }

    fn reopens_for_reset(&self) -> bool {
        true
    }

    async fn send(&mut self, out: Outgoing, _span: &Span) -> Result<(), SendError> {
        if !self.open || self.down {
            return Err(SendError::NotConnected);
        }
        let knobs = self.knobs.lock().expect("knobs").clone();
        let is_reset = matches!(out.body, RpcBody::Reset);
        self.record
            .lock()
            .expect("record")
            .sent
            .push((out.rpc_id, is_reset));
        let reply = match out.body {
            RpcBody::Lookup { num_tokens, .. } => Reply::Lookup {
                hit_tokens: (knobs.hit)(num_tokens),
            },
            RpcBody::Reset => Reply::Reset { ok: true },
        };
        if knobs.stalled || self.rng.random_bool(knobs.drop) {
            return Ok(());
        }
        let (lo, hi) = knobs.latency;
        let latency = if hi > lo {
            lo + Duration::from_nanos(self.rng.random_range(0..(hi - lo).as_nanos() as u64))
        } else {
            lo
        };
        let at = clock::now() + latency;
        if self.rng.random_bool(knobs.duplicate) {
            self.schedule(at + latency, out.rpc_id, reply.clone());
        }
        self.schedule(at, out.rpc_id, reply);
        Ok(())
    }

    fn lookups_timed_out(&mut self) {
        let alive = self.knobs.lock().expect("knobs").alive;
        if !alive && !self.down {
            self.down = true;
            self.report = Some(WireInput::Unreachable(EndpointUnreachable::Silent {
                endpoint: "fake".to_owned(),
                bound: super::peer::LIVENESS_BOUND,
            }));
        }
    }

    async fn next(&mut self) -> WireInput<Reply> {
        if let Some(input) = self.report.take() {
            return input;
        }
        let Some((&(at, _), _)) = self.due.first_key_value() else {
            return std::future::pending().await;
        };
        // Cancel-safe: the reply stays queued until the sleep completes.
        clock::sleep_until(at).await;
        let (_, (rpc_id, reply)) = self.due.pop_first().expect("peeked");
        WireInput::Reply {
            rpc_id,
            payload: reply,
        }
    }

    fn close(&mut self) {
        self.open = false;
        // Replies on a dropped connection never arrive.
        self.due.clear();
    }

    fn open(&mut self) -> Result<(), String> {
        let mut knobs = self.knobs.lock().expect("knobs");
        let mut record = self.record.lock().expect("record");
        if knobs.open_failures > 0 {
            knobs.open_failures -= 1;
            record.open_failures_at.push(clock::now());
            return Err("refused (fake)".into());
        }
        record.opens += 1;
        self.open = true;
        Ok(())
    }
}
