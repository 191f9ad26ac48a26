//! The overload detector on real runs: an engine fed faster than it prefills is
//! found collapsed (its queue grows while requests arrive, it drains long after the
//! last arrival), and no verdict over its reruns calls it stable; the same requests
//! at a rate it keeps up with are healthy.

mod common;

use common::{req, run, tiny_params};
use lookup_sim::health::Health;
use lookup_sim::mechanism::{Mechanism, diagnose};
use lookup_sim::mode::Mode;
use lookup_sim::report::summarise;
use lookup_sim::stability::Verdict;
use lookup_sim::trace::TraceRequest;

/// 3,000 requests of 4,000 tokens (one output token), `gap_ms` apart, each its own
/// prompt. One engine prefills one in 50 ms (10 ms + 4,000 x 10 µs).
fn trace(gap_ms: u64) -> Vec<TraceRequest> {
    (0..3_000)
        .map(|i| req(i * gap_ms, 4_000, 1, &[10 * i + 1, 10 * i + 2]))
        .collect()
}

#[test]
fn an_engine_fed_faster_than_it_prefills_is_collapsed_and_never_stable() {
    let p = tiny_params(1);
    let r = run(&trace(20), Mode::Sync, &p);
    let h = Health::of(&r);
    // Arrivals end at 59.98 s; the backlog takes 74.7 s more (too short for the
    // drain sign, 120 s, but the queue grows by ~1,660 requests a minute).
    assert_eq!(h.span_s, 59.98);
    assert_eq!(h.drain_s, (r.makespan_ns - r.trace_span_ns) as f64 / 1e9);
    assert_eq!(h.drain_s, 74.686);
    assert!(h.waiting_slope_per_min > 1_600.0, "{h:?}");
    assert!(h.collapsed);
    assert_eq!(h.signs.len(), 1, "{h:?}");
    assert!(h.signs[0].starts_with("waiting queue grows "), "{h:?}");
    // Its reruns are identical (no jitter, no bursts): a spread of 1, and unstable.
    let s = summarise(&r, p.engine.gpu_kv_blocks);
    let v = Verdict::of(Mode::Sync, &[s.clone(), s]);
    assert_eq!(v.spread, 1.0);
    assert_eq!(v.collapsed_runs, 2);
    assert!(!v.stable);
}

#[test]
fn an_engine_that_keeps_up_is_healthy() {
    let p = tiny_params(1);
    let r = run(&trace(100), Mode::Sync, &p);
    let h = Health::of(&r);
    assert_eq!(h.span_s, 299.9);
    assert!(h.drain_s < 1.0, "{h:?}");
    assert!(h.waiting_slope_per_min.abs() < 0.1, "{h:?}");
    assert_eq!(h.preemptions_per_request, 0.0);
    assert!(!h.collapsed);
    assert!(h.signs.is_empty());
}

/// The counters that name a collapse's mechanism, on the collapsed engine in async
/// mode: each waiting request probed gets its lookup, so the lookups in flight grow
/// with the queue, but the GPU is saturated, so it is overload, not a lookup backlog;
/// the KV cache (3,200 blocks, 250 a request) is never the bound, and nothing is
/// preempted.
#[test]
fn a_collapse_counts_the_lookups_in_flight_and_the_kv_bound_samples() {
    let p = tiny_params(1);
    let r = run(&trace(20), Mode::Async, &p);
    let s = summarise(&r, p.engine.gpu_kv_blocks);
    assert!(
        (s.lookups_in_flight_slope_per_min - 145.85).abs() < 0.01,
        "{}",
        s.lookups_in_flight_slope_per_min
    );
    assert_eq!(s.lookups_in_flight_peak, 1460);
    assert_eq!(s.kv_bound_share, 0.0);
    assert_eq!(s.preemptions_max, 0);
    assert!(s.gpu_utilisation > 0.99, "{}", s.gpu_utilisation);
    let v = Verdict::of(Mode::Async, &[s]);
    let m = diagnose(&v, &v);
    assert!(
        matches!(
            m,
            Mechanism::Overload {
                collapsed: 1,
                runs: 1,
                ..
            }
        ),
        "{m:?}"
    );
}

/// A run the queue recovers from is still unhealthy when one request was preempted
/// 10 times or more (a transient cascade), or when its p99 is over twice the best
/// mode's median; each sign says how far past its threshold it is.
#[test]
fn a_request_preempted_ten_times_or_a_p99_over_twice_the_best_median_is_unhealthy() {
    let p = tiny_params(1);
    let mut r = run(&trace(100), Mode::Sync, &p).result;
    r.preemptions_max = 9;
    let h = Health::of(&r);
    assert!(!h.collapsed, "{h:?}");
    assert_eq!((h.preemptions_max, h.severity), (9, 0.0));
    r.preemptions_max = 12;
    let mut h = Health::of(&r);
    assert!(h.collapsed);
    assert_eq!(
        h.signs,
        ["a request preempted 12 times (unhealthy from 10)"]
    );
    assert_eq!(h.severity, 1.2);
    // The tail sign: 2x the best median is still healthy, above it is not.
    r.preemptions_max = 0;
    let mut ok = Health::of(&r);
    ok.judge_tail(4_000.0, 2_000.0);
    assert!(!ok.collapsed && ok.signs.is_empty(), "{ok:?}");
    ok.judge_tail(5_000.0, f64::INFINITY);
    assert!(!ok.collapsed);
    h.judge_tail(5_000.0, 2_000.0);
    assert_eq!(
        h.signs[1],
        "TTFT p99 5000 ms, 2.5x the best mode's median 2000 ms (unhealthy over 2x)"
    );
    assert_eq!(h.severity, 1.25);
    // The verdict over such reruns is not stable, however close their p99s.
    let mut s = summarise(&r, p.engine.gpu_kv_blocks);
    let healthy = s.clone();
    s.health = h;
    let v = Verdict::of(Mode::Sync, &[healthy, s]);
    assert_eq!((v.spread, v.collapsed_runs, v.stable), (1.0, 1, false));
}
