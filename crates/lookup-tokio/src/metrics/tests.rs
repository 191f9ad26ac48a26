//! The client's metric handles against a Prometheus recorder of their own: each
//! label lands in its series, counters follow the core's by difference, gauges move
//! by each client's share.

use std::sync::atomic::Ordering;
use std::time::Duration;

use lookup_core::{LookupOutcome, RpcFailure, Stats};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

use super::*;
use crate::metrics::client::{FIRST_PROBES_PENDING, FIRST_PROBES_READY};

/// A recorder of its own (not the global one) and its rendering.
fn recorder() -> PrometheusRecorder {
    PrometheusBuilder::new()
        .set_buckets(&LATENCY_BUCKETS_SECONDS)
        .expect("buckets")
        .build_recorder()
}

/// The value of the series `series` (name and labels as rendered), if present.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().expect("a number"))
    })
}

#[test]
fn outcome_labels() {
    let hit = LookupOutcome::Hit { hit_tokens: 16 };
    assert_eq!(LookupEnd::of(hit, 2), LookupEnd::Hit);
    assert_eq!(LookupEnd::of(hit, 0), LookupEnd::Stale);
    assert_eq!(LookupEnd::of(LookupOutcome::Miss, 1), LookupEnd::Miss);
    assert_eq!(
        LookupEnd::of(LookupOutcome::Malformed, 1),
        LookupEnd::Malformed
    );
    assert_eq!(
        LookupEnd::of(LookupOutcome::Failed(RpcFailure::TimedOut), 1),
        LookupEnd::TimedOut
    );
    assert_eq!(
        LookupEnd::of(LookupOutcome::Failed(RpcFailure::Transport), 1),
        LookupEnd::Failed
    );
    assert_eq!(
        LookupEnd::of(LookupOutcome::Failed(RpcFailure::NotSent), 1),
        LookupEnd::Failed
    );
    assert_eq!(
        LookupEnd::of(LookupOutcome::Failed(RpcFailure::TimedOut), 0),
        LookupEnd::Stale
    );
}

/// Each outcome lands in the series whose label is its name (the handle arrays
/// are indexed by the enum).
#[test]
fn each_outcome_records_under_its_label() {
    let recorder = recorder();
    let handle = recorder.handle();
    let client = metrics::with_local_recorder(&recorder, ClientMetrics::new);
    let all = [
        LookupEnd::Hit,
        LookupEnd::Miss,
        LookupEnd::Failed,
        LookupEnd::TimedOut,
        LookupEnd::Malformed,
        LookupEnd::Cancelled,
        LookupEnd::Stale,
    ];
    for (i, end) in all.into_iter().enumerate() {
        for _ in 0..=i {
            client.lookup_ended(end, Duration::from_millis(3));
        }
    }
    let text = handle.render();
    for (i, end) in all.into_iter().enumerate() {
        let label = end.as_str();
        let expected = (i + 1) as f64;
        assert_eq!(
            value(
                &text,
                &format!("lookup_outcomes_total{{outcome=\"{label}\"}}")
            ),
            Some(expected),
            "{label}"
        );
        assert_eq!(
            value(
                &text,
                &format!("lookup_latency_seconds_count{{outcome=\"{label}\"}}")
            ),
            Some(expected),
            "{label}"
        );
        // 3 ms falls in the 5 ms bucket and not in the 2.5 ms one.
        assert_eq!(
            value(
                &text,
                &format!("lookup_latency_seconds_bucket{{outcome=\"{label}\",le=\"0.005\"}}")
            ),
            Some(expected)
        );
        assert_eq!(
            value(
                &text,
                &format!("lookup_latency_seconds_bucket{{outcome=\"{label}\",le=\"0.0025\"}}")
            ),
            Some(0.0)
        );
    }
}

/// Counters follow the core's by difference; gauges move by this client's share
/// and give it back when the client goes.
#[test]
fn sync_publishes_differences() {
    let recorder = recorder();
    let handle = recorder.handle();
    let mut client = metrics::with_local_recorder(&recorder, ClientMetrics::new);
    let mut stats = Stats::default();
    stats.lookups_arrival = 3;
    stats.lookups_probe = 1;
    stats.rpcs_shared = 1;
    stats.ttl_refreshes = 2;
    stats.prefetch_cap_full = 4;
    assert_eq!(client.sync(&stats, 2), 1);
    assert_eq!(client.sync(&stats, 2), 0, "nothing changed");
    stats.lookups_arrival = 5;
    stats.rpcs_shared = 3;
    stats.chain_refreshes = 1;
    assert_eq!(client.sync(&stats, 1), 2);
    let text = handle.render();
    let get = |series: &str| value(&text, series);
    assert_eq!(get("lookup_lookups_total{origin=\"arrival\"}"), Some(5.0));
    assert_eq!(get("lookup_lookups_total{origin=\"probe\"}"), Some(1.0));
    assert_eq!(get("lookup_rpcs_shared_total"), Some(3.0));
    assert_eq!(get("lookup_refreshes_total{reason=\"ttl\"}"), Some(2.0));
    assert_eq!(get("lookup_refreshes_total{reason=\"chain\"}"), Some(1.0));
    assert_eq!(
        get("lookup_prefetch_skipped_total{reason=\"cap_full\"}"),
        Some(4.0)
    );
    assert_eq!(
        get("lookup_prefetch_skipped_total{reason=\"ineligible\"}"),
        Some(0.0)
    );
    assert_eq!(get("lookup_prefetch_slots_in_use"), Some(1.0));

    let other = metrics::with_local_recorder(&recorder, ClientMetrics::new);
    let mut other = other;
    other.sync(&Stats::default(), 3);
    assert_eq!(
        value(&handle.render(), "lookup_prefetch_slots_in_use"),
        Some(4.0),
        "the gauge sums the clients"
    );
    drop(client);
    assert_eq!(
        value(&handle.render(), "lookup_prefetch_slots_in_use"),
        Some(3.0)
    );
    drop(other);
    assert_eq!(
        value(&handle.render(), "lookup_prefetch_slots_in_use"),
        Some(0.0)
    );
}

#[test]
fn first_probe_counters_and_ratio() {
    let _only = PROCESS_WIDE.blocking_lock();
    let recorder = recorder();
    let handle = recorder.handle();
    let mut client = metrics::with_local_recorder(&recorder, ClientMetrics::new);
    // The ratio is process-wide; other tests of this binary may add to it, so
    // only this test's counters are checked exactly.
    let mut stats = Stats::default();
    stats.first_probes_ready = 3;
    stats.first_probes_pending = 1;
    client.sync(&stats, 0);
    let text = handle.render();
    assert_eq!(
        value(&text, "lookup_first_probes_total{result=\"ready\"}"),
        Some(3.0)
    );
    assert_eq!(
        value(&text, "lookup_first_probes_total{result=\"pending\"}"),
        Some(1.0)
    );
    let ready = FIRST_PROBES_READY.load(Ordering::Relaxed) as f64;
    let pending = FIRST_PROBES_PENDING.load(Ordering::Relaxed) as f64;
    assert_eq!(
        value(&text, "lookup_first_probe_ready_ratio"),
        Some(ready / (ready + pending))
    );
}

#[test]
fn actor_gauge_and_reopens() {
    let recorder = recorder();
    let handle = recorder.handle();
    let mut actor = metrics::with_local_recorder(&recorder, ActorMetrics::new);
    actor.lookup_on_wire();
    actor.lookup_on_wire();
    actor.lookup_off_wire();
    actor.reopened(ReopenReason::Timeouts);
    actor.reopened(ReopenReason::Error);
    actor.reopened(ReopenReason::Error);
    actor.late_reply();
    let text = handle.render();
    assert_eq!(value(&text, "lookup_in_flight"), Some(1.0));
    assert_eq!(
        value(&text, "lookup_socket_reopens_total{reason=\"timeouts\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "lookup_socket_reopens_total{reason=\"reset\"}"),
        Some(0.0)
    );
    assert_eq!(
        value(&text, "lookup_socket_reopens_total{reason=\"error\"}"),
        Some(2.0)
    );
    assert_eq!(value(&text, "lookup_late_replies_total"), Some(1.0));
    drop(actor);
    assert_eq!(value(&handle.render(), "lookup_in_flight"), Some(0.0));
}
