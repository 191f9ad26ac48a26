//! The client's observability on virtual time with the seeded fake wire: the
//! `client` label, the token counters and the lookup time per request, each read
//! back exactly from a Prometheus recorder of the test's own; and what is kept per
//! announced request is released when the request finishes.

use std::time::Duration;

use lookup_core::{BlockHashes, Probe, Request, RequestId};
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::runtime::Handle;

use crate::io::fake::{FakeWire, Knobs};
use crate::metrics::LATENCY_BUCKETS_SECONDS;
use crate::{ClientConfig, Deadline, Endpoint, LookupClient};

const MS: Duration = Duration::from_millis(1);

fn req(id: u64, blocks: u64) -> Request {
    let hashes: Vec<u64> = (0..blocks).map(|b| id * 1000 + b).collect();
    Request {
        request_id: RequestId(id),
        num_tokens: u32::try_from(blocks * 16 + 1).expect("small"),
        block_hashes: BlockHashes::from_u64s(&hashes),
        skip_reading_external_kv: false,
    }
}

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().expect("a number"))
    })
}

#[tokio::test(start_paused = true)]
async fn tokens_and_lookup_time_per_request_under_the_clients_label() {
    let _only = crate::metrics::PROCESS_WIDE.lock().await;
    let recorder = PrometheusBuilder::new()
        .set_buckets(&LATENCY_BUCKETS_SECONDS)
        .expect("buckets")
        .build_recorder();
    let handle = recorder.handle();
    let knobs = Knobs {
        latency: (5 * MS, 5 * MS),
        hit: |n| n / 16 * 16,
        ..Knobs::default()
    };
    let (wire, _, _) = FakeWire::new(7, knobs);
    let endpoint: Endpoint = "ipc:///tmp/unused-fake-wire".parse().expect("endpoint");
    let mut config = ClientConfig::zmq(endpoint, 16);
    config.core.lookup_async = true;
    config.core.lookup_prefetch_limit = 8;
    config.client_label = Some("dp3".to_owned());
    let mut client = metrics::with_local_recorder(&recorder, || {
        LookupClient::with_wire(config, wire, &Handle::current())
    })
    .expect("client");

    // 4 blocks (65 tokens): the store holds 64; 16 are local, so 48 are external.
    let r = req(1, 4);
    client.on_new_request_with_id(&r, "cmpl-7f3a");
    tokio::time::sleep(7 * MS).await;
    let ready = Probe::Ready {
        external_tokens: 48,
        load_async: true,
    };
    assert_eq!(client.probe(&r, 16), ready);
    tokio::time::sleep(3 * MS).await;
    assert_eq!(client.probe(&r, 16), ready, "the cached result");
    // Probed without an arrival: counted, but there is no arrival to time from.
    let unannounced = req(2, 2);
    assert_eq!(client.probe(&unannounced, 0), Probe::Pending);
    tokio::time::sleep(6 * MS).await;
    assert_eq!(
        client.probe(&unannounced, 0),
        Probe::Ready {
            external_tokens: 32,
            load_async: true
        }
    );
    // The arrival time went with the first Ready answer, and the caller's id was not
    // kept: no span records it while debug tracing is off (no subscriber here).
    assert_eq!(client.core.observer().tracked(), 0);
    client.on_allocated(r.request_id);
    client.on_finished(r.request_id);
    client.on_finished(unannounced.request_id);
    assert_eq!(
        client.core.observer().tracked(),
        0,
        "nothing kept once finished"
    );

    let text = handle.render();
    let get = |series: &str| value(&text, series);
    assert_eq!(
        get("lookup_tokens_queried_total{client=\"dp3\"}"),
        Some(65.0 + 33.0)
    );
    assert_eq!(
        get("lookup_hit_tokens_total{client=\"dp3\"}"),
        Some(64.0 + 32.0)
    );
    assert_eq!(
        get("lookup_external_tokens_total{client=\"dp3\"}"),
        Some(48.0 * 2.0 + 32.0)
    );
    assert_eq!(
        get("lookup_request_lookup_seconds_count{client=\"dp3\"}"),
        Some(1.0)
    );
    assert_eq!(
        get("lookup_request_lookup_seconds_sum{client=\"dp3\"}"),
        Some(0.007)
    );
    assert_eq!(
        get("lookup_outcomes_total{client=\"dp3\",outcome=\"hit\"}"),
        Some(2.0)
    );
    assert_eq!(get("lookup_in_flight{client=\"dp3\"}"), Some(0.0));
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("lookup_") && !l.contains("client=\"dp3\""))
            .collect::<Vec<_>>(),
        Vec::<&str>::new(),
        "every series carries the label"
    );
    client.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_idle_sweep_forgets_what_the_client_kept_per_request() {
    let _only = crate::metrics::PROCESS_WIDE.lock().await;
    let (wire, _, _) = FakeWire::new(8, Knobs::default());
    let endpoint: Endpoint = "ipc:///tmp/unused-fake-wire".parse().expect("endpoint");
    let mut config = ClientConfig::zmq(endpoint, 16);
    config.core.lookup_async = true;
    config.core.lookup_prefetch_limit = 8;
    let mut client = LookupClient::with_wire(config, wire, &Handle::current()).expect("client");
    for id in 1..=3 {
        client.on_new_request_with_id(&req(id, 2), &format!("r{id}"));
    }
    tokio::time::sleep(10 * MS).await;
    client.on_new_request(&req(4, 2));
    assert_eq!(client.core.observer().tracked(), 4);
    assert_eq!(client.end_idle(5 * MS), 3);
    assert_eq!(client.core.observer().tracked(), 1);
    assert_eq!(client.stats().tracked_requests, 1);
    client.shutdown().await;
}

/// The three probe forms' waits, on virtual time with a fixed 5 ms lookup: a
/// deadline before the reply answers `Pending` in async mode and a `Ready(0)` that
/// gave up in sync mode (rule 10: never `Pending`); `Deadline::Answer` waits for the
/// reply; a deadline already past answers at once. (`probe_until_blocking` shares the
/// bounds; its threads are tested against real servers.)
#[tokio::test(start_paused = true)]
async fn each_deadline_waits_as_long_as_it_says() {
    let knobs = Knobs {
        latency: (5 * MS, 5 * MS),
        hit: |n| n / 16 * 16,
        ..Knobs::default()
    };
    let hit = |blocks: u32| Probe::Ready {
        external_tokens: blocks * 16,
        load_async: true,
    };
    let zero = Probe::Ready {
        external_tokens: 0,
        load_async: false,
    };
    let endpoint: Endpoint = "ipc:///tmp/unused-fake-wire".parse().expect("endpoint");
    for lookup_async in [true, false] {
        let (wire, _, _) = FakeWire::new(11, knobs.clone());
        let mut config = ClientConfig::zmq(endpoint.clone(), 16);
        config.core.lookup_async = lookup_async;
        let mut client = LookupClient::with_wire(config, wire, &Handle::current()).expect("client");
        let expected = if lookup_async {
            Deadline::Within(Duration::ZERO)
        } else {
            Deadline::Answer
        };
        assert_eq!(client.step_deadline(), expected);

        let r = req(1, 4);
        let past = tokio::time::Instant::now().into_std();
        let started = tokio::time::Instant::now();
        let at_once = client.probe_until(&r, 0, Deadline::At(past)).await;
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "a past deadline never waits"
        );
        let short = client.probe_until(&r, 0, Deadline::Within(2 * MS)).await;
        assert_eq!(started.elapsed(), 2 * MS);
        if lookup_async {
            assert_eq!((at_once, short), (Probe::Pending, Probe::Pending));
            assert_eq!(client.stats().waits_gave_up, 0);
        } else {
            assert_eq!(
                (at_once, short),
                (zero, zero),
                "sync mode never answers Pending"
            );
            assert_eq!(client.stats().waits_gave_up, 2);
        }
        // The lookup went on: the reply comes 5 ms after the first probe.
        assert_eq!(client.probe_until(&r, 0, Deadline::Answer).await, hit(4));
        assert_eq!(started.elapsed(), 5 * MS);

        client.shutdown().await;
    }
}

/// Rule 8, `lookup_on_preemption` = `wait`: a preempted request's probe waits up to
/// `lookup_preempted_wait_s` for its new lookup instead of answering `Pending` at a
/// zero budget, so younger requests do not overtake it; with `discard` it is deferred.
#[tokio::test(start_paused = true)]
async fn a_preempted_request_is_waited_for_with_the_wait_policy() {
    let knobs = Knobs {
        latency: (5 * MS, 5 * MS),
        hit: |n| n / 16 * 16,
        ..Knobs::default()
    };
    let endpoint: Endpoint = "ipc:///tmp/unused-fake-wire".parse().expect("endpoint");
    for (policy, expected) in [
        (
            lookup_core::OnPreemption::Wait,
            (Duration::from_millis(5), true),
        ),
        (lookup_core::OnPreemption::Discard, (Duration::ZERO, false)),
    ] {
        let (wire, _, _) = FakeWire::new(5, knobs.clone());
        let mut config = ClientConfig::zmq(endpoint.clone(), 16);
        config.core.lookup_async = true;
        config.core.lookup_on_preemption = policy;
        config.core.lookup_preempted_wait = 20 * MS;
        let mut client = LookupClient::with_wire(config, wire, &Handle::current()).expect("client");
        let r = req(1, 4);
        let hit = Probe::Ready {
            external_tokens: 64,
            load_async: true,
        };
        assert_eq!(client.probe_until(&r, 0, Deadline::Answer).await, hit);
        client.on_allocated(r.request_id);
        client.on_preempted(r.request_id);
        let started = tokio::time::Instant::now();
        let answer = client
            .probe_until(&r, 0, Deadline::Within(Duration::ZERO))
            .await;
        assert_eq!(
            (started.elapsed(), answer == hit),
            expected,
            "{policy:?}: {answer:?}"
        );
        client.shutdown().await;
    }
}
