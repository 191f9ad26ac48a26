//! What the engines share ([`World`]: the trace being read, the live requests, the
//! external store, the run's figures), and a request's state ([`Req`]).
//!
//! The trace is read one request ahead of the virtual clock ([`Feed`]) and a request
//! is dropped when it finishes, after its figures went into the run's histograms:
//! what a run holds is the requests in the engines, not the trace.

use std::collections::VecDeque;
use std::ops::{Index, IndexMut};

use anyhow::bail;
use lookup_core::{BlockHashes, Request, RequestId, RpcId};

use super::SimParams;
use super::params::Router;
use super::result::{Breakdown, ModeResult, RequestRecord};
use crate::mode::Mode;
use crate::store::{ExternalStore, Held, KV_BLOCK_TOKENS, group_hash};
use crate::trace::{TRACE_BLOCK_TOKENS, TraceError, TraceRequest};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    NotArrived,
    Waiting,
    Loading { done_at: u64, tokens: u32 },
    Running,
}

/// A live request. About 200 bytes plus 16 bytes per full 512-token block (its ids
/// and their hashes) and 8 per block it holds on the GPU.
#[derive(Debug)]
pub(super) struct Req {
    /// 0-based position in the trace: its `RequestId`.
    pub(super) seq: u64,
    pub(super) engine: u32,
    pub(super) core: Request,
    /// The trace's ids of its full 512-token prompt blocks: the external store's keys.
    pub(super) hashes: Vec<u64>,
    /// Prefix-cache hashes of its full prompt blocks at the GPU cache's granularity
    /// ([`EngineParams::prefix_hash_tokens`](super::EngineParams::prefix_hash_tokens));
    /// blocks past them hash uniquely to the request ([`group_hash`]).
    pub(super) kv_hashes: Vec<u64>,
    pub(super) arrival: u64,
    pub(super) input: u32,
    pub(super) output: u32,
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
    /// Its KV blocks on the GPU.
    pub(super) held: Held,
    pub(super) prefetch_rpc: Option<RpcId>,
    /// A lookup was started at arrival (its own RPC or a shared one).
    pub(super) prefetched: bool,
    pub(super) probed: bool,
    pub(super) first_scheduled: Option<u64>,
    /// First probe.
    pub(super) first_probe: Option<u64>,
    /// The probe answered `Ready` (after any wait).
    pub(super) ready_at: Option<u64>,
    /// Its load of external tokens ended.
    pub(super) load_done: Option<u64>,
    /// Its first tokens were scheduled for compute.
    pub(super) first_compute: Option<u64>,
    pub(super) ttft: Option<u64>,
    pub(super) breakdown: Breakdown,
    pub(super) local_hit_tokens: u32,
    pub(super) external_hit_tokens: u32,
    pub(super) preemptions: u32,
    /// The fence stamp of the last step it was scheduled in
    /// ([`Fence`](super::fence::Fence), vLLM `request.last_sched_seq`).
    pub(super) last_sched_seq: u64,
}

impl Req {
    pub(super) fn new(
        seq: u64,
        engine: u32,
        mut tr: TraceRequest,
        arrival: u64,
        cap: Option<u32>,
        hash_tokens: u32,
    ) -> Self {
        if let Some(cap) = cap {
            tr.output_length = tr.output_length.min(cap);
        }
        let hashes = tr.hash_ids[..tr.full_blocks()].to_vec();
        let kv_hashes = if hash_tokens == TRACE_BLOCK_TOKENS {
            hashes.clone()
        } else {
            kv_hashes_of(&tr, hash_tokens)
        };
        Self {
            kv_hashes,
            seq,
            engine,
            core: Request {
                request_id: RequestId(seq),
                num_tokens: tr.input_length,
                block_hashes: BlockHashes::from_u64s(&hashes),
                skip_reading_external_kv: false,
            },
            hashes,
            arrival,
            input: tr.input_length,
            output: tr.output_length,
            target: tr.input_length + tr.output_length - 1,
            prefill_len: tr.input_length,
            num_computed: 0,
            outputs: 0,
            epoch: 0,
            phase: Phase::NotArrived,
            held: Held::default(),
            prefetch_rpc: None,
            prefetched: false,
            probed: false,
            first_scheduled: None,
            first_probe: None,
            ready_at: None,
            load_done: None,
            first_compute: None,
            ttft: None,
            breakdown: Breakdown::default(),
            local_hit_tokens: 0,
            external_hit_tokens: 0,
            preemptions: 0,
            last_sched_seq: 0,
        }
    }

    /// The prefix-cache hash of the request's `k`-th 512-token block (0-based):
    /// [`group_hash`].
    pub(super) fn block_hash(&self, k: usize) -> u64 {
        group_hash(&self.hashes, self.seq, k)
    }

    /// The hashes of the request's first `blocks` blocks ([`block_hash`](Self::block_hash)).
    pub(super) fn chain(&self, blocks: usize) -> Vec<u64> {
        (0..blocks).map(|k| self.block_hash(k)).collect()
    }

    /// The prefix-cache hashes of its first `blocks` blocks at the GPU cache's
    /// granularity ([`kv_hashes`](Self::kv_hashes), then unique ones).
    pub(super) fn kv_chain(&self, blocks: usize) -> Vec<u64> {
        (0..blocks)
            .map(|k| group_hash(&self.kv_hashes, self.seq, k))
            .collect()
    }

    /// The first token is out at `now`: TTFT and where it went.
    pub(super) fn first_token(&mut self, now: u64) {
        let ttft = now - self.arrival;
        self.ttft = Some(ttft);
        let probe = self.first_probe.unwrap_or(self.arrival);
        let ready = self.ready_at.unwrap_or(probe);
        let loaded = self.load_done.unwrap_or(ready).max(ready);
        let compute = self.first_compute.unwrap_or(loaded).max(loaded);
        self.breakdown = Breakdown {
            queue_ns: (probe - self.arrival) + (compute - loaded),
            lookup_wait_ns: ready - probe,
            load_ns: loaded - ready,
            prefill_ns: now - compute,
        };
    }

    pub(super) fn record(&self, finished_ns: u64) -> RequestRecord {
        RequestRecord {
            seq: self.seq,
            engine: self.engine,
            arrival_ns: self.arrival,
            input_length: self.input,
            output_length: self.output,
            ttft_ns: self.ttft.unwrap_or(0),
            queue_wait_ns: self.first_scheduled.map_or(0, |s| s - self.arrival),
            breakdown: self.breakdown,
            external_hit_tokens: self.external_hit_tokens,
            local_hit_tokens: self.local_hit_tokens,
            preemptions: self.preemptions,
            finished_ns,
        }
    }
}

/// The prefix-cache hashes of `tr`'s full prompt blocks of `hash_tokens` tokens
/// (dividing 512): block `j` of the trace's block with id `h` hashes to
/// [`sub_block_hash`]`(h, j)`, for every block wholly inside the prompt and inside a
/// trace block with an id, the partial last trace block included (its full blocks are
/// full in vLLM too). Equal ids at equal positions are equal prefixes, so equal
/// hashes are equal token blocks, as vLLM's chained block hashes
/// (`hash_block_tokens`, vllm/v1/core/kv_cache_utils.py) would find them.
pub(super) fn kv_hashes_of(tr: &TraceRequest, hash_tokens: u32) -> Vec<u64> {
    let per = (TRACE_BLOCK_TOKENS / hash_tokens) as usize;
    let full = (tr.input_length / hash_tokens) as usize;
    let n = full.min(tr.hash_ids.len() * per);
    (0..n)
        .map(|b| sub_block_hash(tr.hash_ids[b / per], b % per))
        .collect()
}

/// The hash of block `j` inside the trace block with id `id`: top bit clear, apart
/// from the request-unique hashes of [`group_hash`].
#[must_use]
pub(super) fn sub_block_hash(id: u64, j: usize) -> u64 {
    mix(id.wrapping_mul(1024) ^ j as u64 ^ 0x5bd1_e995) >> 1
}

/// One request's part of a step.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) req: usize,
    /// The request's `seq`: its slot may hold another request by the step's output.
    pub(super) seq: u64,
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

/// The live requests, in reusable slots (an engine's queues hold slot numbers).
#[derive(Debug, Default)]
pub(super) struct Slab {
    slots: Vec<Option<Req>>,
    free: Vec<usize>,
    live: usize,
}

impl Slab {
    pub(super) fn insert(&mut self, r: Req) -> usize {
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(r);
                i
            }
            None => {
                self.slots.push(Some(r));
                self.slots.len() - 1
            }
        }
    }

    pub(super) fn remove(&mut self, i: usize) -> Option<Req> {
        let r = self.slots.get_mut(i)?.take()?;
        self.free.push(i);
        self.live -= 1;
        Some(r)
    }

    /// The request in slot `i`, if it is still request `seq`.
    pub(super) fn get_mut(&mut self, i: usize, seq: u64) -> Option<&mut Req> {
        self.slots.get_mut(i)?.as_mut().filter(|r| r.seq == seq)
    }

    /// Requests live at once, at most (the slots ever used).
    pub(super) fn peak(&self) -> usize {
        self.slots.len()
    }
}

impl Index<usize> for Slab {
    type Output = Req;

    fn index(&self, i: usize) -> &Req {
        self.slots[i].as_ref().expect("a live request's slot")
    }
}

impl IndexMut<usize> for Slab {
    fn index_mut(&mut self, i: usize) -> &mut Req {
        self.slots[i].as_mut().expect("a live request's slot")
    }
}

/// The trace, read one burst ahead: checked, stamped with its arrival. A burst (the
/// requests of one timestamp) is handed out in the trace's order, or shuffled by
/// `SimParams::order_seed` (a rerun's perturbation).
pub(super) struct Feed<'a> {
    iter: Box<dyn Iterator<Item = Result<TraceRequest, TraceError>> + 'a>,
    /// The rest of the current burst, in the order it is handed out.
    burst: VecDeque<(TraceRequest, u64)>,
    /// The first request of the next burst, read ahead.
    ahead: Option<(TraceRequest, u64)>,
    /// Lines read (for an error's 1-based position).
    read: u64,
    seq: u64,
    bursts: u64,
    done: bool,
}

impl<'a> Feed<'a> {
    pub(super) fn new(
        iter: Box<dyn Iterator<Item = Result<TraceRequest, TraceError>> + 'a>,
    ) -> Self {
        Self {
            iter,
            burst: VecDeque::new(),
            ahead: None,
            read: 0,
            seq: 0,
            bursts: 0,
            done: false,
        }
    }

    fn read_one(&mut self, p: &SimParams) -> anyhow::Result<Option<(TraceRequest, u64)>> {
        if let Some(a) = self.ahead.take() {
            return Ok(Some(a));
        }
        if self.done {
            return Ok(None);
        }
        match self.iter.next() {
            None => {
                self.done = true;
                Ok(None)
            }
            Some(r) => {
                let r = r?;
                let arrival = check(&r, self.read, p)?;
                self.read += 1;
                Ok(Some((r, arrival)))
            }
        }
    }

    /// The arrival of the next request not handed out yet (ns), reading its burst if
    /// needed; `None` at the end of the trace.
    ///
    /// # Errors
    /// A bad trace line; a request that cannot fit a GPU's KV cache even alone, or
    /// arrives later than 10^18 ns (naming its 1-based position).
    pub(super) fn peek(&mut self, p: &SimParams) -> anyhow::Result<Option<u64>> {
        if self.burst.is_empty() {
            let Some(first) = self.read_one(p)? else {
                return Ok(None);
            };
            let at = first.1;
            self.burst.push_back(first);
            if p.order_seed != 0 {
                while let Some(next) = self.read_one(p)? {
                    if next.1 != at {
                        self.ahead = Some(next);
                        break;
                    }
                    self.burst.push_back(next);
                }
                // Fisher-Yates with a SplitMix stream of this burst.
                self.bursts += 1;
                let mut state = mix(p.order_seed ^ mix(self.bursts));
                for i in (1..self.burst.len()).rev() {
                    state = mix(state);
                    let j = (state % (i as u64 + 1)) as usize;
                    self.burst.swap(i, j);
                }
            }
        }
        Ok(self.burst.front().map(|(_, a)| *a))
    }

    /// Takes the request [`peek`](Self::peek) gave.
    fn take(&mut self) -> Option<(u64, TraceRequest, u64)> {
        let (r, arrival) = self.burst.pop_front()?;
        let seq = self.seq;
        self.seq += 1;
        Some((seq, r, arrival))
    }
}

/// KV blocks of 16 tokens request `r` holds at its longest (every prompt and output
/// position but the last): a GPU with fewer cannot serve it.
#[must_use]
pub fn kv_blocks_needed(r: &TraceRequest) -> u64 {
    let positions = (u64::from(r.input_length) + u64::from(r.output_length)).saturating_sub(1);
    positions.div_ceil(u64::from(KV_BLOCK_TOKENS))
}

/// Checks request number `seq` (0-based) and returns its arrival (ns).
fn check(r: &TraceRequest, seq: u64, p: &SimParams) -> anyhow::Result<u64> {
    let e = &p.engine;
    let positions = u64::from(r.input_length) + u64::from(r.output_length) - 1;
    let need = kv_blocks_needed(r);
    if need > e.gpu_kv_blocks || positions > u64::from(u32::MAX) {
        bail!(
            "request {} ({} input + {} output tokens) needs {need} KV blocks of {KV_BLOCK_TOKENS} tokens; \
             a GPU has {} (--gpu-kv-blocks)",
            seq + 1,
            r.input_length,
            r.output_length,
            e.gpu_kv_blocks
        );
    }
    // Virtual time is u64 nanoseconds: keep arrivals far from overflowing it.
    let at = r.timestamp as f64 * 1e6 / p.rate_scale;
    if at > 1e18 {
        bail!(
            "request {} arrives at {} ms, beyond what the simulator's clock holds at rate scale {}",
            seq + 1,
            r.timestamp,
            p.rate_scale
        );
    }
    Ok(at.round() as u64)
}

pub(crate) use crate::hash::mix;

/// The engine request `seq` goes to, moved by `offset` (a rerun's perturbation).
fn route(seq: u64, r: &TraceRequest, engines: u32, router: Router, offset: u32) -> u32 {
    let slot = match (router, r.hash_ids.get(1)) {
        (Router::Prefix, Some(&id)) => mix(id),
        _ => seq,
    };
    (slot.wrapping_add(u64::from(offset)) % u64::from(engines)) as u32
}

/// What the engines share: the trace being read, the live requests, the external
/// store, and the run's figures so far.
pub(super) struct World<'a> {
    pub(super) p: &'a SimParams,
    pub(super) mode: Mode,
    pub(super) feed: Feed<'a>,
    pub(super) reqs: Slab,
    pub(super) store: ExternalStore,
    pub(super) result: ModeResult,
    pub(super) on_finished: &'a dyn Fn(&RequestRecord),
}

impl<'a> World<'a> {
    pub(super) fn new(
        feed: Feed<'a>,
        mode: Mode,
        p: &'a SimParams,
        on_finished: &'a dyn Fn(&RequestRecord),
    ) -> Self {
        Self {
            p,
            mode,
            feed,
            reqs: Slab::default(),
            store: ExternalStore::new(p.store.capacity_blocks),
            result: ModeResult::new(mode, p.engine.engines),
            on_finished,
        }
    }

    /// Hands the request read ahead to its engine: returns (engine, slot).
    pub(super) fn admit_next(&mut self) -> Option<(usize, usize)> {
        let (seq, r, arrival) = self.feed.take()?;
        let e = &self.p.engine;
        let engine = route(seq, &r, e.engines, e.router, self.p.route_offset);
        self.result.trace_span_ns = self.result.trace_span_ns.max(arrival);
        let cap = self.p.engine.max_output_tokens;
        let hash_tokens = self.p.engine.prefix_hash_tokens;
        let slot = self
            .reqs
            .insert(Req::new(seq, engine, r, arrival, cap, hash_tokens));
        Some((engine as usize, slot))
    }

    /// Request `slot` finished at `now`: its figures go into the run's, and it is
    /// dropped.
    pub(super) fn finish(&mut self, slot: usize, now: u64) {
        if let Some(r) = self.reqs.remove(slot) {
            let record = r.record(now);
            self.result.finished(&record);
            (self.on_finished)(&record);
        }
    }
}
