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
//!   new probe. An allocation failure ends the waiting loop (`break`).
//! - **GPU KV cache** (`store::LocalCache`): 512-token blocks with a prefix cache of
//!   full prompt blocks.
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

mod params;
mod replica;
mod scheduler;
mod world;

use std::collections::VecDeque;

use anyhow::{Context, bail};

pub use self::params::{
    ArrivalHandling, EngineParams, PendingPolicy, Router, SimParams, StoreParams,
};
use self::replica::Engine;
use self::world::World;
pub use self::world::{FirstPending, ModeResult};
use super::connector::Connector;
use super::mode::Mode;
use super::server::LookupServer;
use super::trace::{TRACE_BLOCK_TOKENS, TraceRequest};

/// A stable 64-bit mix (SplitMix64's finaliser) for prefix routing.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The engine each request goes to.
fn route(trace: &[TraceRequest], engines: u32, router: Router) -> Vec<usize> {
    let n = engines as usize;
    trace
        .iter()
        .enumerate()
        .map(|(i, r)| match (router, r.hash_ids.get(1)) {
            (Router::Prefix, Some(&id)) => (mix(id) % engines as u64) as usize,
            _ => i % n,
        })
        .collect()
}

/// Runs `trace` through the engines in `mode`. `on_finished` is called once per
/// finished request (for a progress bar).
///
/// # Errors
/// A request that cannot fit a GPU's KV cache even alone, or arrives later than 10^18
/// ns (naming its 1-based position in the trace); an invalid lookup configuration; a rate scale that is not a
/// finite positive number; no engine; a stalled simulation (a bug, reported rather
/// than hung).
pub fn simulate(
    trace: &[TraceRequest],
    mode: Mode,
    params: &SimParams,
    on_finished: &dyn Fn(),
) -> anyhow::Result<ModeResult> {
    let e = &params.engine;
    if !(params.rate_scale.is_finite() && params.rate_scale > 0.0) {
        bail!(
            "--rate-scale must be a finite number > 0, got {}",
            params.rate_scale
        );
    }
    if e.engines == 0 || e.max_num_batched_tokens == 0 || e.max_num_seqs == 0 {
        bail!("--engines, --max-num-batched-tokens and --max-num-seqs must be at least 1");
    }
    for (i, r) in trace.iter().enumerate() {
        let positions = u64::from(r.input_length) + u64::from(r.output_length) - 1;
        let need = positions.div_ceil(u64::from(TRACE_BLOCK_TOKENS));
        if need > e.gpu_kv_blocks || positions > u64::from(u32::MAX) {
            bail!(
                "request {} ({} input + {} output tokens) needs {need} KV blocks of {TRACE_BLOCK_TOKENS} tokens; \
                 a GPU has {} (--gpu-kv-blocks)",
                i + 1,
                r.input_length,
                r.output_length,
                e.gpu_kv_blocks
            );
        }
        // Virtual time is u64 nanoseconds: keep arrivals far from overflowing it.
        if r.timestamp as f64 * 1e6 / params.rate_scale > 1e18 {
            bail!(
                "request {} arrives at {} ms, beyond what the simulator's clock holds at rate scale {}",
                i + 1,
                r.timestamp,
                params.rate_scale
            );
        }
    }
    let routes = route(trace, e.engines, e.router);
    let mut engines = Vec::with_capacity(e.engines as usize);
    for id in 0..e.engines as usize {
        let config = mode.config(&params.lookup, params.server.concurrency.max(1));
        let server = LookupServer::new(params.server.clone(), mix(params.seed ^ mix(id as u64)));
        let conn = Connector::new(config, server).context("lookup configuration")?;
        let arrivals: VecDeque<usize> = (0..trace.len()).filter(|&i| routes[i] == id).collect();
        engines.push(Engine::new(arrivals, conn, e.gpu_kv_blocks));
    }
    let mut world = World::new(trace, mode, params);
    loop {
        let next = engines
            .iter()
            .enumerate()
            .filter_map(|(i, en)| en.next_time(&world).map(|t| (t, i)))
            .min();
        let Some((t, i)) = next else { break };
        engines[i].act(t, &mut world, on_finished)?;
    }
    Ok(world.result(mode, &engines))
}
