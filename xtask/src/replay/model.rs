//! What the replay's engines are given and what they measure: the modelled GPU
//! ([`EngineModel`]), the requests ([`Prepared`]), where finished prefills' blocks go
//! ([`BlockSink`]), and one engine's measurements ([`EngineResult`]).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use lookup_core::{BlockHashes, Request, RequestId};
use lookup_tokio::{ClientStats, KeyLayout};

use super::peers::PutBatch;
use crate::simulate::engine::Sample;
use crate::simulate::trace::{TRACE_BLOCK_TOKENS, TraceRequest};

/// The modelled GPU and scheduler limits of one engine. Defaults: the simulator's
/// ([`EngineParams`](crate::simulate::engine::EngineParams) and
/// [`StoreParams`](crate::simulate::engine::StoreParams)): one H100 serving an 8B
/// model, loads at 2.7 ms per 512-token block.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct EngineModel {
    /// Token budget of one step (`max_num_batched_tokens`).
    pub max_num_batched_tokens: u32,
    /// Most requests running or loading at once (`max_num_seqs`).
    pub max_num_seqs: u32,
    /// Fixed cost of a step (seconds).
    pub step_fixed_s: f64,
    /// Cost per prefill token (seconds).
    pub prefill_token_s: f64,
    /// Cost per attended (query token, context token) pair of prefill (seconds).
    pub prefill_pair_s: f64,
    /// Cost per decoding request in a step (seconds).
    pub decode_seq_s: f64,
    /// Cost per context token a decoding request reads (seconds).
    pub decode_ctx_token_s: f64,
    /// Fixed cost of one load from the store (seconds).
    pub load_fixed_s: f64,
    /// Load cost per 512-token block (seconds).
    pub load_block_s: f64,
    /// Output tokens generated per request at most (the trace's `output_length`
    /// capped): 1 ends each request with its first token, so only prefill loads the
    /// engine.
    pub max_output_tokens: u32,
    /// GPU KV-cache capacity in vLLM's 16-token blocks (`num_gpu_blocks`); a request
    /// whose blocks do not fit preempts the most recently admitted one.
    pub gpu_kv_blocks: u64,
    /// The GPU's prefix cache: full blocks are cached and later requests (and a
    /// preempted one) hit them locally before asking the store.
    pub prefix_cache: bool,
}

impl Default for EngineModel {
    fn default() -> Self {
        let e = crate::simulate::engine::EngineParams::default();
        let s = crate::simulate::engine::StoreParams::default();
        Self {
            max_num_batched_tokens: e.max_num_batched_tokens,
            max_num_seqs: e.max_num_seqs,
            step_fixed_s: e.step_fixed_s,
            prefill_token_s: e.prefill_token_s,
            prefill_pair_s: e.prefill_pair_s,
            decode_seq_s: e.decode_seq_s,
            decode_ctx_token_s: e.decode_ctx_token_s,
            load_fixed_s: s.load_fixed_s,
            load_block_s: s.load_block_s,
            max_output_tokens: 1,
            gpu_kv_blocks: e.gpu_kv_blocks,
            prefix_cache: e.local_prefix_cache,
        }
    }
}

impl EngineModel {
    /// The simulator's engine with this model's GPU and limits, as the replay runs
    /// it: `engines` engines routed round-robin, one step at a time (no batch queue),
    /// the scheduler free, vLLM's skip-and-continue for a pending lookup, arrivals
    /// probed while waiting, and outputs capped at `max_output_tokens` (`None`: the
    /// trace's own lengths).
    #[must_use]
    pub fn sim_engine(
        &self,
        engines: u32,
        max_output_tokens: Option<u32>,
    ) -> crate::simulate::engine::EngineParams {
        use crate::simulate::engine::{ArrivalHandling, EngineParams, PendingPolicy, Router};
        EngineParams {
            engines,
            router: Router::RoundRobin,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            gpu_kv_blocks: self.gpu_kv_blocks,
            step_fixed_s: self.step_fixed_s,
            prefill_token_s: self.prefill_token_s,
            prefill_pair_s: self.prefill_pair_s,
            decode_seq_s: self.decode_seq_s,
            decode_ctx_token_s: self.decode_ctx_token_s,
            scheduler_s: 0.0,
            scheduler_probe_s: 0.0,
            arrivals: ArrivalHandling::WhileWaiting,
            on_pending: PendingPolicy::Skip,
            batch_queue: 1,
            max_output_tokens,
            local_prefix_cache: self.prefix_cache,
            // Replay's GPU model (`replay::gpu`) caches 512-token groups and admits
            // on the first chunk: the simulator is set the same for the comparison.
            prefix_hash_tokens: TRACE_BLOCK_TOKENS,
            scheduler_reserve_full_isl: false,
            load_kv_async: true,
        }
    }

    /// Modelled GPU time of a step (seconds).
    pub(super) fn step_s(&self, entries: &[Entry]) -> f64 {
        let mut s = self.step_fixed_s;
        for e in entries {
            match *e {
                Entry::Prefill { before, new, .. } => {
                    let (n, c) = (f64::from(new), f64::from(before));
                    s += n * self.prefill_token_s
                        + (n * c + n * (n + 1.0) / 2.0) * self.prefill_pair_s;
                }
                Entry::Decode { context, .. } => {
                    s += self.decode_seq_s + f64::from(context) * self.decode_ctx_token_s;
                }
            }
        }
        s
    }

    /// Modelled time to load `tokens` external tokens.
    pub(super) fn load(&self, tokens: u32) -> Duration {
        let blocks = tokens.div_ceil(TRACE_BLOCK_TOKENS);
        Duration::from_secs_f64(self.load_fixed_s + f64::from(blocks) * self.load_block_s)
    }
}

/// One request as the engines see it.
#[derive(Debug)]
pub struct Prepared {
    /// What the lookup is asked about (`num_tokens` = the prompt, one hash per full
    /// vLLM block of it, [`block_id`]).
    pub core: Request,
    /// The vLLM blocks written when its prefill ends: those of its full 512-token
    /// trace blocks.
    pub block_ids: Vec<u64>,
    /// When it arrives.
    pub arrival: Instant,
    /// Outputs to generate (at least 1).
    pub outputs: u32,
    /// The trace's ids of its full 512-token prompt blocks (the GPU prefix cache's
    /// hashes, [`group_hash`](crate::simulate::store::group_hash)).
    pub hashes: Vec<u64>,
}

/// The id of vLLM block `j` (of `block_size` tokens) of request number `seq`: within
/// a full 512-token trace block of id `h`, `h × 512 + j mod (512 / block_size)`, so
/// requests sharing the trace block share its vLLM blocks; within the prompt's partial
/// trace block, an id of the request's own (`2^62 + seq × 2^18 + j`): the trace says
/// nothing about who shares a partial block, and the simulator counts those keys as
/// absent too.
#[must_use]
pub fn block_id(r: &TraceRequest, seq: u64, j: usize, block_size: u32) -> u64 {
    block_id_of(&r.hash_ids[..r.full_blocks()], seq, j, block_size)
}

/// [`block_id`] of a request whose full trace blocks have the ids `full`: past them
/// (the partial block, or generated tokens after a preemption), the request's own.
#[must_use]
pub fn block_id_of(full: &[u64], seq: u64, j: usize, block_size: u32) -> u64 {
    let per = (TRACE_BLOCK_TOKENS / block_size.max(1)).max(1) as usize;
    match full.get(j / per) {
        Some(&h) => h * u64::from(TRACE_BLOCK_TOKENS) + (j % per) as u64,
        None => (1 << 62) + (seq << 18) + j as u64,
    }
}

impl Prepared {
    /// The trace's requests, arriving from `t0` with arrivals compressed `rate_scale`
    /// times, outputs capped at `max_output_tokens`, hashed per vLLM block of
    /// `block_size` tokens (a divisor of 512).
    #[must_use]
    pub fn from_trace(
        trace: &[TraceRequest],
        t0: Instant,
        rate_scale: f64,
        max_output_tokens: u32,
        block_size: u32,
    ) -> Vec<Self> {
        let first = trace.first().map_or(0, |r| r.timestamp);
        let per = (TRACE_BLOCK_TOKENS / block_size.max(1)).max(1) as usize;
        trace
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let blocks = (r.input_length / block_size.max(1)) as usize;
                let all: Vec<u64> = (0..blocks)
                    .map(|j| block_id(r, i as u64, j, block_size))
                    .collect();
                let block_ids = all[..(r.full_blocks() * per).min(blocks)].to_vec();
                let offset = (r.timestamp - first) as f64 / 1e3 / rate_scale;
                Self {
                    core: Request {
                        request_id: RequestId(i as u64),
                        num_tokens: r.input_length,
                        block_hashes: BlockHashes::from_u64s(&all),
                        skip_reading_external_kv: false,
                    },
                    block_ids,
                    arrival: t0 + Duration::from_secs_f64(offset),
                    outputs: r.output_length.min(max_output_tokens.max(1)).max(1),
                    hashes: r.hash_ids[..r.full_blocks()].to_vec(),
                }
            })
            .collect()
    }
}

/// Where finished prefills' blocks go.
#[derive(Clone, Debug)]
pub struct BlockSink {
    /// The writer's queue.
    pub tx: mpsc::Sender<PutBatch>,
    /// Block ids already handed to the writer (by any engine).
    pub written: Arc<Mutex<HashSet<u64>>>,
    /// The store keys of a block.
    pub layout: KeyLayout,
}

impl BlockSink {
    /// Hands the blocks of `ids` not written yet to the writer.
    pub(super) fn write(&self, ids: &[u64], at: Instant) {
        let fresh: Vec<u64> = {
            let mut written = self
                .written
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            ids.iter()
                .copied()
                .filter(|id| written.insert(*id))
                .collect()
        };
        if fresh.is_empty() {
            return;
        }
        let keys = self
            .layout
            .chain_keys(&BlockHashes::from_u64s(&fresh), fresh.len());
        // The writer outlives the engines; a send fails only if it died, which the
        // run reports from the writer's own stats.
        let _ = self.tx.send(PutBatch { keys, at });
    }
}

/// What one engine measured.
#[derive(Debug)]
pub struct EngineResult {
    /// (request index, TTFT) of each request that got its first token.
    pub ttft: Vec<(usize, Duration)>,
    /// Arrival to first scheduling (compute or load), per scheduled request.
    pub queue_wait: Vec<Duration>,
    /// Requests finished.
    pub finished: u64,
    /// Time the step loop spent waiting in sync probes (or `prefetch+wait` waits).
    pub blocked: Duration,
    /// Probes answered `Pending` that pushed a request to a later step.
    pub deferred: u64,
    /// First probes answered `Pending` on an idle engine (nothing running or loading):
    /// it probes a request as soon as it arrives, before its prefetch can answer.
    pub first_pending_idle: u64,
    /// Steps run.
    pub steps: u64,
    /// Tokens loaded from the store instead of computed.
    pub external_hit_tokens: u64,
    /// Lookup RPCs: send to end (`Event::LookupDone::on_wire`), µs.
    pub on_wire_us: Histogram<u64>,
    /// Lookup RPCs: submission to end (`Event::LookupDone::total`), µs.
    pub total_us: Histogram<u64>,
    /// Lookup RPC outcomes: hit, miss, malformed, failed (timeouts included), timed out.
    pub outcomes: Outcomes,
    /// The client's counters at the end.
    pub stats: ClientStats,
    /// When the last request finished.
    pub last_finish: Option<Instant>,
    /// Recompute preemptions.
    pub preemptions: u64,
    /// Most preemptions of one request.
    pub preemptions_max: u32,
    /// Its state once per [`SAMPLE_NS`](crate::simulate::engine::SAMPLE_NS) from the
    /// first arrival (`engine` 0: the run numbers them).
    pub samples: Vec<Sample>,
}

/// Lookup RPC outcomes, counted from the client's events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Outcomes {
    /// Replies with hit tokens > 0.
    pub hit: u64,
    /// Replies of 0 tokens.
    pub miss: u64,
    /// Malformed replies.
    pub malformed: u64,
    /// Timed out.
    pub timed_out: u64,
    /// Failed otherwise (transport, not sent).
    pub failed: u64,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Entry {
    Prefill { req: usize, before: u32, new: u32 },
    Decode { req: usize, context: u32 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_time_is_the_simulators_cost_model() {
        let model = EngineModel::default();
        let entries = [
            Entry::Prefill {
                req: 0,
                before: 512,
                new: 1024,
            },
            Entry::Decode {
                req: 1,
                context: 1000,
            },
        ];
        // 5 ms fixed; 1024 tokens at 30 µs; 1024·512 + 1024·1025/2 = 1,049,088 pairs at
        // 1 ns; one decode of 20 µs plus 1000 context tokens at 39 ns.
        let want = 0.005 + 0.030_72 + 0.001_049_088 + 0.000_02 + 0.000_039;
        assert!((model.step_s(&entries) - want).abs() < 1e-12);
        assert!((model.step_s(&[]) - 0.005).abs() < 1e-12);
        // 1,025 tokens span 3 blocks of 512, loaded at 2.7 ms each.
        assert_eq!(model.load(1025), Duration::from_secs_f64(0.0081));
    }

    #[test]
    fn arrivals_are_compressed_and_only_full_blocks_are_asked() {
        let trace = [
            TraceRequest {
                timestamp: 1000,
                input_length: 1100,
                output_length: 50,
                hash_ids: vec![7, 8, 9],
            },
            TraceRequest {
                timestamp: 3000,
                input_length: 512,
                output_length: 1,
                hash_ids: vec![7],
            },
        ];
        let t0 = Instant::now();
        let reqs = Prepared::from_trace(&trace, t0, 2.0, 4, 512);
        assert_eq!(reqs[0].arrival, t0);
        assert_eq!(reqs[1].arrival, t0 + Duration::from_secs(1));
        assert_eq!(reqs[0].block_ids, [7 * 512, 8 * 512]);
        assert_eq!(
            reqs[0].core.block_hashes,
            BlockHashes::from_u64s(&[7 * 512, 8 * 512])
        );
        assert_eq!(reqs[0].core.num_tokens, 1100);
        // Block size 256: two vLLM blocks per trace block, and the partial third
        // trace block (76 tokens) has none; at 16, 68 blocks, the last 4 of the
        // request's own, never written.
        let reqs = Prepared::from_trace(&trace, t0, 2.0, 4, 256);
        let ids = [7 * 512, 7 * 512 + 1, 8 * 512, 8 * 512 + 1];
        assert_eq!(reqs[0].block_ids, ids);
        assert_eq!(reqs[0].core.block_hashes, BlockHashes::from_u64s(&ids));
        let reqs = Prepared::from_trace(&trace, t0, 2.0, 4, 16);
        assert_eq!(reqs[0].core.block_hashes.len(), 68);
        assert_eq!(reqs[0].block_ids.len(), 64);
        assert_eq!(block_id(&trace[0], 0, 64, 16), (1 << 62) + 64);
        assert_eq!(block_id(&trace[1], 1, 31, 16), 7 * 512 + 31);
        assert_eq!((reqs[0].outputs, reqs[1].outputs), (4, 1));
        assert_eq!(reqs[1].core.request_id, RequestId(1));
    }
}
