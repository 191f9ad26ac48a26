//! The engine model on tiny traces whose TTFTs and lookup costs are computed by hand,
//! and determinism over threads and reruns.

mod common;

use std::sync::Arc;

use common::{MS, Run, req, run, tiny_params};
use lookup_sim::budget::WaitBudget;
use lookup_sim::engine::{ArrivalHandling, SimParams};
use lookup_sim::mode::Mode;
use lookup_sim::server::ServerParams;
use lookup_sim::trace::{TraceRequest, TraceSource};
use lookup_sim::{generator, report, run_modes};

/// One engine. R0 (1100 tokens, 3 outputs) arrives at 0 on an idle engine; R1
/// (600 tokens, 1 output) at 5 ms, while R0's prefill runs (step [1, 22] ms; the
/// next step, R0's first decode, is already queued for [22, 32] ms).
///
/// - sync: R0's probe blocks 1 ms, prefill [1, 22]: TTFT 22. R1 is probed at 22 when
///   S1's output is processed, blocks to 23, and joins R0's second decode in the step
///   queued behind [22, 32]: [32, 48] (10 + 6 ms): TTFT 48 − 5 = 43.
/// - async: R0 is deferred at 0 and scheduled when the reply lands at 1 ms (the
///   engine is idle): TTFT 22. R1's first probe at 22 starts its lookup: deferred; the
///   step built at 22 holds only R0's decode, [32, 42]; R1 is scheduled at 32 into
///   [42, 58]: TTFT 53.
/// - prefetch: R0 as async (its lookup, started at arrival, is still on the wire at
///   its first probe). R1's lookup starts at its arrival (5 ms) and is done at 6, so
///   its first probe at 22 is ready: as sync without the block, TTFT 43.
#[test]
fn engine_tiny_trace_exact_ttfts_per_mode() {
    let trace = vec![req(0, 1100, 3, &[1, 2, 3]), req(5, 600, 1, &[7, 8])];
    let p = tiny_params(1);

    let sync = run(&trace, Mode::Sync, &p);
    assert_eq!(sync.ttft_ns(), vec![22 * MS, 43 * MS]);
    assert_eq!(sync.queue_wait_ns(), vec![MS, 18 * MS]);
    assert_eq!(sync.blocked_ns, 2 * MS);
    assert_eq!(sync.deferred, 0);
    assert_eq!(
        (
            sync.stats.first_probes_ready,
            sync.stats.first_probes_pending
        ),
        (0, 2)
    );
    assert_eq!(sync.rpcs_sent, 2);
    assert_eq!(sync.steps, 3);
    assert_eq!(sync.makespan_ns, 48 * MS);
    // GPU: [1, 22] + [22, 32] + [32, 48].
    assert_eq!(sync.gpu_busy_ns, 47 * MS);

    let asynch = run(&trace, Mode::Async, &p);
    assert_eq!(asynch.ttft_ns(), vec![22 * MS, 53 * MS]);
    assert_eq!(asynch.blocked_ns, 0);
    assert_eq!(asynch.deferred, 2);
    assert_eq!(
        (
            asynch.stats.first_probes_ready,
            asynch.stats.first_probes_pending
        ),
        (0, 2)
    );
    assert_eq!(asynch.rpcs_sent, 2);
    assert_eq!(asynch.steps, 4);

    // Handled only between steps (before vLLM #65466), R1 arriving at 5 ms enters at
    // 22 ms, when S1's output is processed: its prefetch starts right before its first
    // probe, which is not ready, so it fares as in async mode.
    let mut between = p.clone();
    between.engine.arrivals = ArrivalHandling::BetweenSteps;
    let late = run(&trace, Mode::Prefetch, &between);
    assert_eq!(late.ttft_ns(), vec![22 * MS, 53 * MS]);
    assert_eq!(late.deferred, 2);
    assert_eq!(late.first_pending.on_the_wire, 2);
    assert_eq!(late.first_pending.on_the_wire_idle, 1);

    for mode in [Mode::Prefetch, Mode::PrefetchPlus] {
        let pre = run(&trace, mode, &p);
        assert_eq!(pre.ttft_ns(), vec![22 * MS, 43 * MS], "{mode}");
        assert_eq!(pre.blocked_ns, 0);
        assert_eq!(pre.deferred, 1);
        assert_eq!(
            (pre.stats.first_probes_ready, pre.stats.first_probes_pending),
            (1, 1)
        );
        assert_eq!(pre.stats.lookups_arrival, 2);
        assert_eq!(pre.rpcs_sent, 2);
        assert_eq!(pre.rpcs_wasted, 0);
    }

    // prefetch+wait: R0's first probe at 0 waits 1 ms for its prefetch (within the
    // 5 ms budget) and is scheduled at 1 as in sync; R1's is ready at 22 as in
    // prefetch. Nothing is deferred and the engine blocks 1 ms, not sync's 2.
    let wait = run(&trace, Mode::PrefetchWait, &p);
    assert_eq!(wait.ttft_ns(), vec![22 * MS, 43 * MS]);
    assert_eq!(wait.blocked_ns, MS);
    assert_eq!(wait.deferred, 0);
    assert_eq!(
        (
            wait.stats.first_probes_ready,
            wait.stats.first_probes_pending
        ),
        (1, 1)
    );
    assert_eq!(wait.rpcs_sent, 2);

    // A budget shorter than the lookup: R0 waits the whole 0.5 ms, is deferred, and
    // is scheduled when the engine next loops at the reply (1 ms), as in async.
    let mut short = p.clone();
    short.lookup.wait_budget = WaitBudget::Fixed { s: 0.0005 };
    let wait = run(&trace, Mode::PrefetchWait, &short);
    assert_eq!(wait.blocked_ns, MS / 2);
    assert_eq!(wait.deferred, 1);
    assert_eq!(wait.ttft_ns()[0], 22 * MS);
}

/// prefetch+wait's budget is per scheduler step. One engine scheduling after each
/// step's output; A, B and C (600 tokens, 1 output each) arrive at 0 and are
/// prefetched at once; the server answers one at a time in 1 ms: A at 1, B at 2, C at
/// 3 ms. Budget 1.5 ms: A's probe waits to 1 (caught), B's the 0.5 ms left, to 1.5
/// (not caught), and C's starts no wait. Both are deferred; A's prefill runs in
/// [1.5, 17.5] ms, then B's and C's in [17.5, 39.5] (10 + 2 x 6 ms). A budget per
/// probe would have blocked to 3 ms and deferred none.
#[test]
fn prefetch_wait_spends_one_budget_per_step() {
    let trace = vec![
        req(0, 600, 1, &[1, 2]),
        req(0, 600, 1, &[3, 4]),
        req(0, 600, 1, &[5, 6]),
    ];
    let mut p = tiny_params(1);
    p.engine.batch_queue = 1;
    p.lookup.wait_budget = WaitBudget::Fixed { s: 0.0015 };
    let r = run(&trace, Mode::PrefetchWait, &p);
    assert_eq!(r.ttft_ns(), vec![17_500_000, 39_500_000, 39_500_000]);
    assert_eq!(r.blocked_ns, 1_500_000);
    assert_eq!((r.waits.started, r.waits.caught), (2, 1));
    assert_eq!(r.waits.budget_ns, 1_500_000 + 500_000);
    assert_eq!(r.deferred, 2);
}

/// Two engines, round robin. R0 (engine 0) is prefilled in [1, 22] ms and its two full
/// blocks are written to the store at 22. R1 (engine 1, same first two blocks) arrives
/// at 100: the server finds 1024 tokens; R1 loads 2 blocks (101 to 105 ms) and
/// computes the last 76 tokens in [105, 115.76]: TTFT 15.76 ms.
#[test]
fn engine_loads_an_external_hit_written_by_another_engine() {
    let trace = vec![req(0, 1100, 1, &[1, 2, 3]), req(100, 1100, 1, &[1, 2, 4])];
    let p = tiny_params(2);
    for mode in Mode::ALL {
        let r = run(&trace, mode, &p);
        assert_eq!(r.ttft_ns(), vec![22 * MS, 15_760_000], "{mode}");
        assert_eq!(r.queue_wait_ns(), vec![MS, MS], "{mode}");
        assert_eq!(r.external_hit_tokens, 1024, "{mode}");
        assert_eq!(r.local_hit_tokens, 0, "{mode}");
        assert_eq!(r.stats.hits, 1, "{mode}");
        assert_eq!(r.store_blocks, 2, "{mode}");
    }
    // Without the store, R1 recomputes everything: [101, 122] ms, TTFT 22 ms.
    let mut no_store = p.clone();
    no_store.store.capacity_blocks = 0;
    let r = run(&trace, Mode::Sync, &no_store);
    assert_eq!(r.ttft_ns(), vec![22 * MS, 22 * MS]);
    assert_eq!(r.external_hit_tokens, 0);
}

/// A second request with the same first block on the same engine hits the GPU cache
/// (512 tokens = the cap for a 600-token prompt), so it needs no lookup, and a
/// prefetch made for it is counted as wasted.
#[test]
fn local_hit_at_the_cap_needs_no_lookup_and_wastes_a_prefetch() {
    let trace = vec![req(0, 600, 1, &[9]), req(100, 600, 1, &[9])];
    let p = tiny_params(1);
    let sync = run(&trace, Mode::Sync, &p);
    // R0: blocks 1 ms, [1, 17] (10 + 6 ms). R1: no RPC, [100, 110.88] (88 tokens).
    assert_eq!(sync.ttft_ns(), vec![17 * MS, 10_880_000]);
    assert_eq!(sync.local_hit_tokens, 512);
    assert_eq!(sync.rpcs_sent, 1);
    assert_eq!(
        (
            sync.stats.first_probes_ready,
            sync.stats.first_probes_pending
        ),
        (1, 1)
    );
    let pre = run(&trace, Mode::Prefetch, &p);
    assert_eq!(pre.ttft_ns(), vec![17 * MS, 10_880_000]);
    assert_eq!(pre.rpcs_sent, 2);
    assert_eq!(pre.rpcs_wasted, 1);
}

#[test]
fn same_trace_seed_and_flags_give_identical_results() {
    let trace: Arc<[TraceRequest]> = generator::generate(3, 400).into();
    let source = TraceSource::Memory(Arc::clone(&trace));
    let mut params = SimParams::default();
    params.server.jitter_s = 0.000_3;
    params.seed = 11;
    let first = run_modes(&source, None, &Mode::ALL, &params, &|_, _| {}).unwrap();
    let second = run_modes(&source, None, &Mode::ALL, &params, &|_, _| {}).unwrap();
    assert_eq!(first, second);
    let sequential: Vec<Run> = Mode::ALL.iter().map(|&m| run(&trace, m, &params)).collect();
    for (a, b) in first.iter().zip(&sequential) {
        assert_eq!(a, &b.result);
    }
    let a: Vec<_> = first.iter().map(|r| report::summarise(r, 832)).collect();
    let b: Vec<_> = second.iter().map(|r| report::summarise(r, 832)).collect();
    assert_eq!(report::table(&a), report::table(&b));
    assert_eq!(first[0].requests, 400);
    assert_eq!(sequential[0].records.len(), 400);
    assert!(
        sequential
            .iter()
            .all(|r| r.records.iter().all(|r| r.ttft_ns > 0))
    );
    // The breakdown adds up to the TTFT, request by request.
    for r in &sequential[0].records {
        let b = &r.breakdown;
        assert_eq!(
            b.queue_ns + b.lookup_wait_ns + b.load_ns + b.prefill_ns,
            r.ttft_ns,
            "request {}",
            r.seq
        );
    }
    // Another seed moves the jitter, hence the figures.
    params.seed = 12;
    let other = run(&trace, Mode::Sync, &params);
    assert_ne!(other.ttft_ns(), sequential[0].ttft_ns());
}

/// Block size 16, 2 namespaces, calls of 64 keys (32 vLLM blocks, one trace block per
/// call) with an early stop; a lookup costs 1 ms + 0.1 ms per call + 1 µs per present
/// key + 0.5 µs per absent key. Two engines, sync mode.
///
/// - R0 (engine 0, at 0; 1,100 tokens, blocks 1, 2 and a partial one): 68 vLLM
///   blocks, 136 keys in the prompt. The store is empty: the first call (blocks 0..32,
///   64 keys) finds block 0 absent and stops. 1 + 0.1 + 64 × 0.0005 = 1.132 ms; then
///   the prefill [1.132, 22.132] ms: TTFT 22.132 ms.
/// - R1 (engine 1, at 100 ms, the same two blocks): the run is 2 trace blocks = 64
///   vLLM blocks, so calls 1 and 2 are all present and the third (blocks 64..68, 8
///   keys of the partial block) ends the run: 128 present and 8 absent keys in 3
///   calls, 1 + 0.3 + 0.128 + 0.004 = 1.432 ms. Then 2 blocks load (4 ms) and 76
///   tokens compute (10.76 ms): TTFT 1.432 + 4 + 10.76 = 16.192 ms.
/// - With one call for every key (vLLM's worker, no early stop): R0 asks all 136 keys
///   (1.168 ms), R1 136 in 1 call (1.232 ms).
#[test]
fn lookup_cost_counts_vllm_blocks_namespaces_and_the_early_stop() {
    let trace = vec![req(0, 1100, 1, &[1, 2, 3]), req(100, 1100, 1, &[1, 2, 4])];
    let mut p = tiny_params(2);
    p.server = ServerParams {
        fixed_s: 0.001,
        per_call_s: 0.000_1,
        present_key_s: 0.000_001,
        absent_key_s: 0.000_000_5,
        block_size: 16,
        namespaces: 2,
        chunk_keys: 64,
        concurrency: 1,
        jitter_s: 0.0,
        shared: false,
    };
    let r = run(&trace, Mode::Sync, &p);
    assert_eq!(r.ttft_ns(), vec![22_132_000, 16_192_000]);
    let l = &r.lookups;
    assert_eq!((l.served, l.calls), (2, 4));
    assert_eq!(
        (l.keys_present, l.keys_absent, l.keys_in_prompt),
        (128, 72, 272)
    );
    assert_eq!((l.on_wire_us.min(), l.on_wire_us.max()), (1_132, 1_432));
    assert_eq!((l.keys_asked.min(), l.keys_asked.max()), (64, 136));
    assert_eq!(r.blocked_ns, 1_132_000 + 1_432_000);
    let b = &r.records[1].breakdown;
    assert_eq!(
        (b.queue_ns, b.lookup_wait_ns, b.load_ns, b.prefill_ns),
        (0, 1_432_000, 4_000_000, 10_760_000)
    );
    // R0 finished before R1 arrived: one request held at a time.
    assert_eq!(r.live_peak, 1);
    let s = report::summarise(&r, 100);
    assert_eq!(s.lookups.calls_mean, 2.0);
    assert_eq!(s.lookups.keys_asked_mean, 100.0);
    // Both prompts are in the first bucket (below 2,048 tokens).
    assert_eq!((s.buckets[0].requests, s.buckets[0].lookups), (2, 2));
    assert_eq!(s.buckets[0].keys_asked_mean, 100.0);

    p.server.chunk_keys = 0;
    let r = run(&trace, Mode::Sync, &p);
    let l = &r.lookups;
    assert_eq!((l.calls, l.keys_present, l.keys_absent), (2, 128, 144));
    assert_eq!((l.on_wire_us.min(), l.on_wire_us.max()), (1_168, 1_232));
    assert_eq!(r.ttft_ns(), vec![22_168_000, 15_992_000]);
}

/// Scheduler time grows with the probes made in a step: at 1 ms a probe, a lone
/// 1,100-token request costs sync one probe (blocked to the reply at 1 ms, then 1 ms
/// of probing: prefill [2, 23] ms) and async two (deferred at 0, the probe's 1 ms
/// lands on the reply at 1 ms; probed again, ready: [2, 23]). TTFT 23 ms in both,
/// against 22 ms without the probe cost.
#[test]
fn each_probe_costs_scheduler_time() {
    let trace = vec![req(0, 1100, 1, &[1, 2, 3])];
    let mut p = tiny_params(1);
    p.engine.scheduler_probe_s = 0.001;
    for mode in [Mode::Sync, Mode::Async] {
        assert_eq!(run(&trace, mode, &p).ttft_ns(), vec![23 * MS], "{mode}");
        assert_eq!(
            run(&trace, mode, &tiny_params(1)).ttft_ns(),
            vec![22 * MS],
            "{mode}"
        );
    }
}
