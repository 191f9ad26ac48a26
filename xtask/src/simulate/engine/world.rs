//! What the engines share ([`World`]: the requests' states and the external store),
//! a request's state ([`Req`]), and what a run measured ([`ModeResult`]).

use lookup_core::{BlockHashes, Request, RequestId, RpcId, Stats};
use serde::Serialize;

use super::SimParams;
use super::replica::Engine;
use crate::simulate::mode::Mode;
use crate::simulate::store::ExternalStore;
use crate::simulate::trace::{TRACE_BLOCK_TOKENS, TraceRequest};

/// What one mode's run measured, summed over the engines. Times in nanoseconds of
/// virtual time.
#[derive(Clone, Debug, PartialEq)]
pub struct ModeResult {
    /// The mode.
    pub mode: Mode,
    /// Engines.
    pub engines: u32,
    /// TTFT of each request, in trace order (ns).
    pub ttft_ns: Vec<u64>,
    /// Queue wait of each request (arrival to first scheduling), in trace order (ns).
    pub queue_wait_ns: Vec<u64>,
    /// Engine-thread time blocked on lookups (sync probes), ns.
    pub blocked_ns: u64,
    /// GPU busy time, all engines, ns.
    pub gpu_busy_ns: u64,
    /// Time the last request finished, ns from the trace start.
    pub makespan_ns: u64,
    /// Steps run.
    pub steps: u64,
    /// Probes answered `Pending` that deferred a request to a later step.
    pub deferred: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Tokens served from the GPU prefix caches at scheduling.
    pub local_hit_tokens: u64,
    /// Tokens loaded from the external store.
    pub external_hit_tokens: u64,
    /// The core's counters, summed over the engines' connectors.
    pub stats: Stats,
    /// RPCs sent whose answer was of no use (see `ModeSummary::rpcs_wasted`).
    pub rpcs_wasted: u64,
    /// Why first probes answered `Pending`.
    pub first_pending: FirstPending,
    /// Blocks in the external store at the end.
    pub store_blocks: u64,
}

/// Why first probes answered `Pending` (each eligible request's first probe at most
/// once). In sync mode these are the probes that blocked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FirstPending {
    /// Not prefetched (a mode without prefetch, every slot taken, backlog full): the
    /// probe started the lookup.
    pub not_prefetched: u64,
    /// Prefetched, but its lookup was still queued or on the wire: the probe came
    /// sooner after arrival than the lookup took.
    pub on_the_wire: u64,
    /// Of `on_the_wire`: the engine had nothing running and no step in flight, so it
    /// scheduled at once on arrival.
    pub on_the_wire_idle: u64,
    /// Prefetched and answered, but older than `lookup_prefetch_ttl_s` by the first
    /// probe: looked up again (rule 6).
    pub expired: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    NotArrived,
    Waiting,
    Loading { done_at: u64, tokens: u32 },
    Running,
    Finished,
}

#[derive(Debug)]
pub(super) struct Req {
    pub(super) core: Request,
    pub(super) hashes: Vec<u64>,
    pub(super) arrival: u64,
    pub(super) input: u32,
    /// Positions to compute in all: prompt + outputs − 1.
    pub(super) target: u32,
    /// Prompt to (re)compute: the input, plus outputs already produced after a preemption.
    pub(super) prefill_len: u32,
    /// Positions scheduled (vLLM `num_computed_tokens`, advanced at scheduling).
    pub(super) num_computed: u32,
    /// Output tokens processed.
    pub(super) outputs: u32,
    /// Bumped on preemption: outputs of steps scheduled before are dropped.
    pub(super) epoch: u32,
    pub(super) phase: Phase,
    pub(super) held_hashed: Vec<u64>,
    pub(super) held_anonymous: u64,
    pub(super) prefetch_rpc: Option<RpcId>,
    /// A lookup was started at arrival (its own RPC or a shared one).
    pub(super) prefetched: bool,
    pub(super) probed: bool,
    pub(super) first_scheduled: Option<u64>,
    pub(super) ttft: Option<u64>,
}

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) req: usize,
    pub(super) epoch: u32,
    /// Positions computed before this step.
    pub(super) before: u32,
    pub(super) new: u32,
}

#[derive(Debug)]
pub(super) struct Step {
    pub(super) end: u64,
    pub(super) entries: Vec<Entry>,
}

pub(super) fn blocks_for(tokens: u32) -> u64 {
    u64::from(tokens.div_ceil(TRACE_BLOCK_TOKENS))
}

/// What the engines share: the trace, the requests' states, the external store.
pub(super) struct World<'a> {
    pub(super) p: &'a SimParams,
    pub(super) mode: Mode,
    pub(super) arrival_ns: Vec<u64>,
    pub(super) reqs: Vec<Req>,
    pub(super) store: ExternalStore,
}

impl<'a> World<'a> {
    pub(super) fn new(trace: &'a [TraceRequest], mode: Mode, p: &'a SimParams) -> Self {
        let arrival_ns: Vec<u64> = trace
            .iter()
            .map(|r| (r.timestamp as f64 * 1e6 / p.rate_scale).round() as u64)
            .collect();
        let reqs = trace
            .iter()
            .enumerate()
            .map(|(i, tr)| {
                let hashes = tr.hash_ids[..tr.full_blocks()].to_vec();
                Req {
                    core: Request {
                        request_id: RequestId(i as u64),
                        num_tokens: tr.input_length,
                        block_hashes: BlockHashes::from_u64s(&hashes),
                        skip_reading_external_kv: false,
                    },
                    hashes,
                    arrival: arrival_ns[i],
                    input: tr.input_length,
                    target: tr.input_length + tr.output_length - 1,
                    prefill_len: tr.input_length,
                    num_computed: 0,
                    outputs: 0,
                    epoch: 0,
                    phase: Phase::NotArrived,
                    held_hashed: Vec::new(),
                    held_anonymous: 0,
                    prefetch_rpc: None,
                    prefetched: false,
                    probed: false,
                    first_scheduled: None,
                    ttft: None,
                }
            })
            .collect();
        Self {
            p,
            mode,
            arrival_ns,
            reqs,
            store: ExternalStore::new(p.store.capacity_blocks),
        }
    }

    pub(super) fn result(self, mode: Mode, engines: &[Engine]) -> ModeResult {
        let mut stats = Stats::default();
        let mut r = ModeResult {
            mode,
            engines: engines.len() as u32,
            ttft_ns: self.reqs.iter().map(|r| r.ttft.unwrap_or(0)).collect(),
            queue_wait_ns: self
                .reqs
                .iter()
                .map(|r| r.first_scheduled.map_or(0, |s| s - r.arrival))
                .collect(),
            blocked_ns: 0,
            gpu_busy_ns: 0,
            makespan_ns: 0,
            steps: 0,
            deferred: 0,
            preemptions: 0,
            local_hit_tokens: 0,
            external_hit_tokens: 0,
            stats: Stats::default(),
            rpcs_wasted: 0,
            first_pending: FirstPending::default(),
            store_blocks: self.store.len() as u64,
        };
        for e in engines {
            r.blocked_ns += e.blocked_ns;
            r.gpu_busy_ns += e.gpu_busy_ns;
            r.makespan_ns = r.makespan_ns.max(e.makespan_ns);
            r.steps += e.steps;
            r.deferred += e.deferred;
            r.preemptions += e.preemptions;
            r.local_hit_tokens += e.local_hit_tokens;
            r.external_hit_tokens += e.external_hit_tokens;
            r.rpcs_wasted += e.conn.counts().rpcs_wasted;
            r.first_pending.expired += e.first_pending.expired;
            r.first_pending.on_the_wire += e.first_pending.on_the_wire;
            r.first_pending.on_the_wire_idle += e.first_pending.on_the_wire_idle;
            r.first_pending.not_prefetched += e.first_pending.not_prefetched;
            add_stats(&mut stats, e.conn.stats());
        }
        r.stats = stats;
        r
    }
}

/// Field-wise sum of the core's counters.
fn add_stats(to: &mut Stats, s: &Stats) {
    to.lookups_arrival += s.lookups_arrival;
    to.lookups_probe += s.lookups_probe;
    to.prefetch_ineligible += s.prefetch_ineligible;
    to.prefetch_cap_full += s.prefetch_cap_full;
    to.prefetch_backlog_full += s.prefetch_backlog_full;
    to.rpcs_created += s.rpcs_created;
    to.rpcs_sent += s.rpcs_sent;
    to.rpcs_shared += s.rpcs_shared;
    to.rpcs_cancelled += s.rpcs_cancelled;
    to.replies_stale += s.replies_stale;
    to.replies_unknown += s.replies_unknown;
    to.hits += s.hits;
    to.misses += s.misses;
    to.failed_timed_out += s.failed_timed_out;
    to.failed_malformed += s.failed_malformed;
    to.failed_transport += s.failed_transport;
    to.ttl_refreshes += s.ttl_refreshes;
    to.chain_refreshes += s.chain_refreshes;
    to.promotions += s.promotions;
    to.probes_pending += s.probes_pending;
    to.probes_ready += s.probes_ready;
    to.first_probes_ready += s.first_probes_ready;
    to.first_probes_pending += s.first_probes_pending;
    to.resets += s.resets;
}
