//! The acceptance scenarios of `spec/behaviour.md`, one test each, with exact values.
//! A harness owns the core, a dispatcher, a simulated clock and a hand-driven server.

use std::time::{Duration, Instant};

use lookup_core::{
    Answer, BlockHashes, Config, Dispatcher, Event, LookupOutcome, Lookups, Probe, Reply, Request,
    RequestId, ResetOutcome, RpcBody, RpcFailure, RpcId, Unavailable,
};

struct Harness {
    lookups: Lookups,
    dispatcher: Dispatcher,
    now: Instant,
    /// RPCs on the wire, in send order.
    wire: Vec<(RpcId, RpcBody)>,
    /// Every RPC ever sent.
    sent: Vec<(RpcId, RpcBody)>,
    events: Vec<Event>,
}

impl Harness {
    fn new(config: Config) -> Self {
        let dispatcher = Dispatcher::new(&config);
        Self {
            lookups: Lookups::new(config).unwrap(),
            dispatcher,
            now: Instant::now(),
            wire: Vec::new(),
            sent: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Prefetch on: async, limit `limit`, block size 16.
    fn prefetch(limit: u32) -> Self {
        let mut c = Config::new(16);
        c.lookup_async = true;
        c.lookup_prefetch_limit = limit;
        c.max_in_flight = 64;
        Self::new(c)
    }

    /// The driving loop of the crate docs: commands into the dispatcher, releases onto
    /// the wire, wire events into the lifecycle, events out.
    fn pump(&mut self) {
        loop {
            let mut progressed = false;
            while let Some(cmd) = self.lookups.poll_transmit() {
                progressed = true;
                self.dispatcher.push(cmd, (), self.now);
            }
            while let Some(out) = self.dispatcher.poll_transmit(self.now) {
                progressed = true;
                self.wire.push((out.rpc_id, out.body.clone()));
                self.sent.push((out.rpc_id, out.body));
            }
            while let Some((event, ())) = self.dispatcher.poll_event() {
                progressed = true;
                let rpc_id = event.rpc_id();
                self.wire.retain(|(id, _)| *id != rpc_id);
                self.lookups.handle_wire_event(event);
            }
            while let Some(e) = self.lookups.poll_event() {
                self.events.push(e);
            }
            if !progressed {
                break;
            }
        }
    }

    fn arrive(&mut self, req: &Request) {
        self.lookups.on_new_request(req, self.now);
        self.pump();
    }

    fn probe(&mut self, req: &Request, num_computed_tokens: u32) -> Probe {
        let p = self.lookups.probe(req, num_computed_tokens, self.now);
        self.pump();
        p
    }

    /// The server answers the RPC `rpc_id` on the wire with `reply`.
    fn answer(&mut self, rpc_id: RpcId, reply: Reply) {
        assert!(
            self.wire.iter().any(|(id, _)| *id == rpc_id),
            "{rpc_id} not on the wire"
        );
        assert!(self.dispatcher.handle_reply(rpc_id, reply, self.now));
        self.pump();
    }

    fn answer_hit(&mut self, rpc_id: RpcId, hit_tokens: u32) {
        self.answer(rpc_id, Reply::Lookup { hit_tokens });
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.dispatcher.handle_timeout(self.now);
        self.pump();
    }

    fn wire_ids(&self) -> Vec<RpcId> {
        self.wire.iter().map(|(id, _)| *id).collect()
    }
}

fn req(id: u64, num_tokens: u32, chain: &[u64]) -> Request {
    Request {
        request_id: RequestId(id),
        num_tokens,
        block_hashes: BlockHashes::from_u64s(chain),
        skip_reading_external_kv: false,
    }
}

fn ready(external_tokens: u32) -> Probe {
    Probe::Ready {
        external_tokens,
        load_async: external_tokens > 0,
    }
}

#[path = "scenarios/acceptance.rs"]
mod acceptance;
#[path = "scenarios/rules.rs"]
mod rules;
