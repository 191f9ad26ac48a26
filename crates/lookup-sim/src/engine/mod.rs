//! A discrete-event model of vLLM-V1-like engines on a virtual clock.
//!
//! # What is modelled
//!
//! - **A deployment of `engines` data-parallel engines** behind a router (round
//!   robin by default, or prefix affinity), sharing one external store. Each engine has
//!   its own GPU, KV cache, scheduler, connector and lookup server (vLLM runs the
//!   lookup server in each engine's worker). Engines interact only through the store;
//!   their actions are interleaved in virtual-time order.
//! - **Engine loop with async scheduling** (vLLM `EngineCore.step_with_batch_queue`,
//!   batch queue of 2): the engine thread schedules step n+1 and hands it to the GPU
//!   while step n runs, then waits for step n's output and processes it. The GPU runs
//!   steps back to back; engine-thread time beyond a step's GPU time is GPU idle time.
//!   With two batches in flight and the Mooncake connector (`kv_both`, a KV
//!   consumer), vLLM fences block frees behind the step in flight
//!   (`defer_block_free`, vllm/v1/core/sched/scheduler.py): a finished or preempted
//!   request's blocks return to the pool once every step scheduled before its free
//!   has run, and the running loop does not preempt a request scheduled in the step
//!   in flight (it stops instead; `fence.rs`).
//! - **Livelock watchdog**: an engine that launches `STALL_STEPS` steps without
//!   an output token ends the run with an error, whatever the mode.
//! - **Scheduler** (vLLM `Scheduler.schedule`, FCFS): a token budget
//!   (`max_num_batched_tokens`) and `max_num_seqs`; running requests first (chunked
//!   prefill, one token per decode), preempting the last running request when KV
//!   blocks run out (recompute); then the waiting queue, probed only while budget is
//!   left and no request was preempted in the step. A waiting request's local
//!   prefix-cache hit is computed, then the connector is probed. A `Pending` probe
//!   skips the request and the scheduler **continues with the next waiting request**:
//!   vLLM's `ext_tokens is None` branch pops the request into
//!   `skipped_waiting_requests` and `continue`s, and skipped requests go back to the
//!   head of the queue, in order, after the loop. So a deferred request does not block
//!   those behind it, which may overtake it. A request with external tokens allocates
//!   its blocks and waits for the load (`WAITING_FOR_REMOTE_KVS`, the default
//!   `load_async = true`), keeping its place; once loaded it is scheduled without a
//!   new probe. Requests holding blocks are served first (vLLM 0.33's
//!   `kv_holding_waiting`), and a load is admitted only beside the blocks in-flight
//!   prefills still need (`_inflight_prefill_reserved_blocks`). A waiting request is
//!   admitted only when its whole prompt fits in free KV (`scheduler_reserve_full_isl`,
//!   default true, vllm/config/scheduler.py). An allocation failure ends the waiting
//!   loop (`break`). The steps are named in `scheduler.rs` and `admit.rs`;
//!   [`stepped`] drives them step by step for the comparison with vLLM's own
//!   scheduler (`cargo xtask fidelity --against vllm`).
//! - **GPU KV cache** (`store::LocalCache`): 16-token KV blocks with a prefix cache of
//!   every full block (512-token groups by default, vLLM's 16-token blocks with
//!   `prefix_hash_tokens = 16`), generated tokens included (vLLM V1 hashes them
//!   all), so a preempted request finds its own blocks again while they are not
//!   evicted; freed blocks without a hash are reused first (`BlockPool.free_blocks`).
//! - **Step cost** ([`EngineParams`]): fixed + per prefill token + per attended
//!   (query, context) pair of prefill + per decode sequence + per context token read
//!   by decode.
//! - **New requests** are handled while the engine thread waits for a step's output
//!   (vLLM #65466, the default) or only between steps; an idle engine handles them at
//!   once. `on_new_request` runs when the request is handled, so with prefetch the
//!   lookup starts then.
//! - **External store** (`store::ExternalStore`): full prompt blocks written when a
//!   request's prefill ends (at the output of its last prefill chunk); loads
//!   serialised on each engine's link at a cost per block.
//! - **Lookup server** ([`server`](super::server)) and the **real connector**
//!   (`lookup_core::Lookups` + `Dispatcher`, `connector`).
//!
//! # Measured
//!
//! TTFT = arrival to the engine thread processing the output of the step that
//! computed the last prompt token (the first token is then emitted). Queue wait =
//! arrival to the first scheduling (blocks allocated for compute or for a load).

mod admit;
mod fence;
mod params;
mod replica;
mod result;
mod sample;
mod scheduler;
mod script;
pub mod stepped;
mod world;

use anyhow::{Context, bail};

pub use self::params::{
    ArrivalHandling, EngineParams, PendingPolicy, Router, SimParams, StoreParams,
};
use self::replica::Engine;
pub use self::result::{
    BUCKET_FLOORS, Breakdown, BreakdownSums, Bucket, FirstPending, LookupFigures, ModeResult,
    Perturbation, RequestRecord, Waits, bucket_of, histogram,
};
use self::sample::Sampler;
pub use self::sample::{KV_BOUND_SHARE, SAMPLE_NS, Sample, Slope};
pub use self::world::kv_blocks_needed;
pub(crate) use self::world::mix;
use self::world::{Feed, World};
use super::connector::Connector;
use super::mode::Mode;
use super::server::LookupServer;
use super::trace::{TraceError, TraceRequest};

/// Runs the requests of `trace` (read one at a time, in arrival order) through the
/// engines in `mode`. `on_finished` is called once per finished request, with its
/// figures (for a progress bar, or to stream per-request results); the run itself
/// keeps only histograms and sums.
///
/// # Errors
/// A bad trace line; a request that cannot fit a GPU's KV cache even alone, or
/// arrives later than 10^18 ns (naming its 1-based position in the trace); invalid
/// parameters ([`SimParams::validate`]); a stalled simulation (a bug, reported rather
/// than hung).
pub fn simulate<I>(
    trace: I,
    mode: Mode,
    params: &SimParams,
    on_finished: &dyn Fn(&RequestRecord),
) -> anyhow::Result<ModeResult>
where
    I: IntoIterator<Item = Result<TraceRequest, TraceError>>,
{
    params.validate()?;
    let e = &params.engine;
    let mut engines = Vec::with_capacity(e.engines as usize);
    let shared = params
        .server
        .shared
        .then(|| LookupServer::workers(&params.server));
    for id in 0..e.engines {
        let config = mode.config(&params.lookup, params.server.concurrency.max(1));
        let server = LookupServer::new(
            params.server.clone(),
            mix(params.seed ^ mix(u64::from(id))),
            shared.clone(),
        );
        let conn = Connector::new(config, server).context("lookup configuration")?;
        engines.push(Engine::new(
            conn,
            e.gpu_kv_blocks,
            e.local_prefix_cache,
            e.prefix_hash_tokens,
            e.batch_queue > 1,
        ));
    }
    let feed = Feed::new(Box::new(trace.into_iter()));
    let mut world = World::new(feed, mode, params, on_finished);
    let mut sampler = Sampler::new(params.timeseries, e.gpu_kv_blocks);
    loop {
        let next = engines
            .iter()
            .enumerate()
            .filter_map(|(i, en)| en.next_time(&world).map(|t| (t, i)))
            .min();
        // Every request arriving by the next event is routed first.
        let arrival = world.feed.peek(params)?;
        if let Some(arrival) = arrival {
            if next.is_none_or(|(t, _)| arrival <= t) {
                let (engine, slot) = world.admit_next().expect("a request was read");
                engines[engine].route(slot);
                continue;
            }
        }
        let Some((t, i)) = next else { break };
        while sampler.next_ns <= t {
            let at = sampler.next_ns;
            let states = engines.iter().zip(0..).map(|(en, id)| en.sample(at, id));
            sampler.take(states, arrival.is_some());
        }
        engines[i].act(t, &mut world)?;
    }
    if let Some(stuck) = engines.iter().find(|en| en.unfinished() > 0) {
        bail!(stuck.stalled(&world));
    }
    let mut result = std::mem::replace(&mut world.result, ModeResult::new(mode, e.engines));
    for en in &engines {
        en.add_to(&mut result);
    }
    result.store_blocks = world.store.len() as u64;
    result.waiting_slope = sampler.waiting;
    result.in_flight_slope = sampler.in_flight;
    result.in_flight_peak = sampler.in_flight_peak;
    result.kv_bound_share = sampler.kv_bound_samples as f64 / sampler.engine_samples.max(1) as f64;
    result.perturbation = Perturbation {
        seed: params.seed,
        rate_scale: params.rate_scale,
        order_seed: params.order_seed,
        route_offset: params.route_offset,
    };
    result.timeseries = sampler.samples;
    result.live_peak = world.reqs.peak() as u64;
    Ok(result)
}
