//! Metrics over the Prometheus exporter (`lookup_tokio::metrics`): a known sequence of
//! lookups through `LookupClient` against a real `LookupServer` (and a silent peer),
//! then the exposition scraped over HTTP on loopback and checked series by series,
//! with exact counter values and histogram sample counts. (The `lookup-server`
//! program's `--metrics-addr` is tested with the program, in `lookup-cli`.)
//!
//! A process has one global recorder and clients take their handles from it at
//! connect, so every in-process assertion lives in one test, in a binary of its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lookup_core::{BlockHashes, Probe, Request, RequestId, ResetOutcome};
use lookup_server::{DelayedIndex, InMemoryIndex, LookupServer, ServerConfig};
use lookup_tests::client::{FakeServer, free_tcp, request};
use lookup_tests::metrics::{call, expect, free_addr, scrape, value};
use lookup_tokio::{ClientConfig, Endpoint, KeyLayout, LookupClient};

const B: u32 = 16;
const LIMIT: Duration = Duration::from_secs(20);
/// Latency of the server's index: long enough that lookups queued behind one on the
/// wire are still queued when the test acts on them.
const INDEX_DELAY: Duration = Duration::from_millis(200);

fn ready(external_tokens: u32) -> Probe {
    Probe::Ready {
        external_tokens,
        load_async: external_tokens > 0,
    }
}

/// An async-mode client (prefetch limit `prefetch`, up to `max_in_flight` on the wire).
fn async_config(endpoint: &Endpoint, prefetch: u32, max_in_flight: u32) -> ClientConfig {
    let mut config = ClientConfig::zmq(endpoint.clone(), B);
    config.core.lookup_async = true;
    config.core.lookup_prefetch_limit = prefetch;
    config.core.max_in_flight = max_in_flight;
    // One label for every client of the test, so that their series add up.
    config.client_label = Some("engine".to_owned());
    config
}

/// Drives the client until `condition` holds on it.
async fn until_client(
    client: &mut LookupClient,
    what: &str,
    mut condition: impl FnMut(&mut LookupClient) -> bool,
) {
    let deadline = Instant::now() + LIMIT;
    loop {
        client.drive();
        if condition(client) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        client.wait_progress(Duration::from_millis(2)).await;
    }
}

/// Probes until `Ready`, sleeping on the client's reports in between.
async fn probe_ready(client: &mut LookupClient, req: &Request) -> Probe {
    let deadline = Instant::now() + LIMIT;
    loop {
        match client.probe(req, 0) {
            Probe::Pending => {
                assert!(Instant::now() < deadline, "{} never ready", req.request_id);
                client.wait_progress(Duration::from_millis(20)).await;
            }
            answer => return answer,
        }
    }
}

/// The whole story in one test (one recorder per process): a silent peer (timeouts,
/// a reopen, the wire and slot gauges mid-flight), a prefetching client (hits, a miss,
/// a shared RPC, a stale and a cancelled lookup, a chain refresh, a probe lookup, a
/// reset), a client whose result outlives its TTL, and raw bad requests to the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporter_reports_a_known_sequence() {
    let metrics_addr = free_addr();
    let handle = lookup_tokio::metrics::install_prometheus(metrics_addr).expect("install");
    // One recorder per process: the server's metrics are described on it too.
    lookup_server::metrics::describe();

    // The server stores blocks 1, 2 (chain 1-2-3) and 4 (chain 4-5-6).
    let layout = KeyLayout::default();
    let memory = Arc::new(InMemoryIndex::new());
    memory.insert_chain(&layout, &BlockHashes::from_u64s(&[1, 2, 3]), 2);
    memory.insert_chain(&layout, &BlockHashes::from_u64s(&[4, 5, 6]), 1);
    let index = Arc::new(DelayedIndex::new(memory, INDEX_DELAY));
    let server = LookupServer::bind(
        &"tcp://127.0.0.1:0".parse().expect("endpoint"),
        ServerConfig::new(B, layout),
        index,
    )
    .expect("bind the server");
    let endpoint = server.local_endpoint().clone();

    // Registered series exist at 0 before anything happens.
    let text = scrape(metrics_addr).await;
    expect(
        &text,
        &[
            (
                "lookup_server_requests_total{format=\"tagged-blob\",kind=\"lookup\"}",
                0.0,
            ),
            ("lookup_server_keys_checked_total", 0.0),
        ],
    );
    assert!(text.contains("# TYPE lookup_server_index_latency_seconds histogram"));

    // --- A silent peer: two lookups on the wire time out, then the socket reopens.
    let silent = FakeServer::silent(&free_tcp());
    let mut config = async_config(silent.endpoint(), 1, 2);
    config.core.lookup_timeout = Duration::from_secs(1);
    config
        .transport
        .zmq_mut()
        .expect("zmq")
        .reopen_after_timeouts = 2;
    let mut s = LookupClient::connect_lazy(config).expect("connect");
    let r20 = request(20, 50, &[21, 22, 23]);
    let r21 = request(21, 50, &[31, 32, 33]);
    let r22 = request(22, 50, &[41, 42, 43]);
    assert_eq!(s.probe(&r20, 0), Probe::Pending);
    s.on_new_request(&r21); // takes the one prefetch slot
    s.on_new_request(&r22); // cap full
    until_client(&mut s, "both sent", |c| c.stats().rpcs_sent == 2).await;
    expect(
        &scrape(metrics_addr).await,
        &[
            ("lookup_in_flight{client=\"engine\"}", 2.0),
            ("lookup_prefetch_slots_in_use{client=\"engine\"}", 1.0),
        ],
    );
    until_client(&mut s, "two timeouts and a reopen", |c| {
        let stats = c.stats();
        stats.core.failed_timed_out == 2 && stats.socket_reopens == 1
    })
    .await;
    for id in [20, 21, 22] {
        s.on_finished(RequestId(id));
    }
    s.shutdown().await;
    silent.stop().await;

    // --- A prefetching client against the real server, one RPC on the wire at a time.
    let mut a = LookupClient::connect_lazy(async_config(&endpoint, 8, 1)).expect("connect");
    let r0 = request(100, 40, &[1, 2]);
    a.on_new_request(&r0);
    until_client(&mut a, "r0 sent", |c| c.stats().rpcs_sent == 1).await;
    a.on_finished(r0.request_id); // on the wire: its reply will answer nobody (stale)
    let r1 = request(1, 50, &[1, 2, 3]);
    let r4 = request(4, 50, &[1, 2, 3]); // the same prompt: shares r1's RPC
    let r2 = request(2, 50, &[4, 5, 6]);
    let r3 = request(3, 50, &[7, 8, 9]);
    let r6 = request(6, 50, &[13, 14, 15]);
    let mut r8 = request(8, 50, &[16, 17]);
    r8.skip_reading_external_kv = true;
    for req in [&r1, &r4, &r2, &r3, &r6, &r8] {
        a.on_new_request(req);
    }
    a.on_finished(r6.request_id); // queued behind r0: cancelled, never sent
    until_client(&mut a, "every prefetch answered", |c| {
        c.stats().open_rpcs == 0
    })
    .await;
    assert_eq!(a.probe(&r1, 0), ready(32));
    assert_eq!(a.probe(&r4, 0), ready(32));
    assert_eq!(a.probe(&r2, 0), ready(16));
    assert_eq!(a.probe(&r3, 0), ready(0));
    // The prompt of r1 grew: a chain refresh, looked up by the probe.
    let r1_grown = request(1, 66, &[1, 2, 3, 10]);
    assert_eq!(probe_ready(&mut a, &r1_grown).await, ready(32));
    // Never seen at arrival: its first probe is pending; a miss.
    let r5 = request(5, 40, &[11, 12]);
    assert_eq!(a.probe(&r5, 0), Probe::Pending);
    assert_eq!(probe_ready(&mut a, &r5).await, ready(0));
    for id in [1, 4, 2, 3, 5, 8] {
        a.on_allocated(RequestId(id));
        a.on_finished(RequestId(id));
    }

    // --- A result that outlives its TTL is looked up again at the probe.
    let mut config = async_config(&endpoint, 1, 1);
    config.core.lookup_prefetch_ttl = Duration::from_millis(50);
    let mut t = LookupClient::connect_lazy(config).expect("connect");
    let r10 = request(10, 50, &[1, 2, 3]);
    t.on_new_request(&r10);
    until_client(&mut t, "r10 answered", |c| c.stats().core.hits == 1).await;
    // Longer than the TTL; no timing is asserted, only that it expired.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(t.probe(&r10, 0), Probe::Pending);
    until_client(&mut t, "r10 refreshed", |c| c.stats().core.hits == 2).await;
    t.on_finished(r10.request_id);
    t.shutdown().await;

    // --- Bad requests straight to the server: a malformed lookup and an unknown tag.
    let malformed = call(&endpoint, &[b"lookup", b"\x00\x00\x00"]).await;
    assert_eq!(malformed, vec![Bytes::from_static(&[0, 0, 0, 0])]);
    let unknown = call(&endpoint, &[b"hello"]).await;
    assert_eq!(unknown, vec![Bytes::from_static(&[0])]);

    // --- A reset last (it wipes the index), then the final scrape.
    assert_eq!(a.reset_and_wait().await.expect("reset"), ResetOutcome::Ok);
    a.shutdown().await;

    let text = scrape(metrics_addr).await;
    let outcome =
        |name: &str, outcome: &str| format!("{name}{{client=\"engine\",outcome=\"{outcome}\"}}");
    let mut samples: Vec<(String, f64)> = vec![
        // Lookups: S 1 arrival + 1 probe; A 6 arrivals + 2 probes; T 1 + 1.
        (
            "lookup_lookups_total{client=\"engine\",origin=\"arrival\"}".into(),
            8.0,
        ),
        (
            "lookup_lookups_total{client=\"engine\",origin=\"probe\"}".into(),
            4.0,
        ),
        ("lookup_rpcs_shared_total{client=\"engine\"}".into(), 1.0),
        (
            "lookup_refreshes_total{client=\"engine\",reason=\"ttl\"}".into(),
            1.0,
        ),
        (
            "lookup_refreshes_total{client=\"engine\",reason=\"chain\"}".into(),
            1.0,
        ),
        (
            "lookup_prefetch_skipped_total{client=\"engine\",reason=\"ineligible\"}".into(),
            1.0,
        ),
        (
            "lookup_prefetch_skipped_total{client=\"engine\",reason=\"cap_full\"}".into(),
            1.0,
        ),
        (
            "lookup_prefetch_skipped_total{client=\"engine\",reason=\"backlog_full\"}".into(),
            0.0,
        ),
        // First probes: ready r1 r4 r2 r3; pending r20 (S), r5 (A), r10 (T).
        (
            "lookup_first_probes_total{client=\"engine\",result=\"ready\"}".into(),
            4.0,
        ),
        (
            "lookup_first_probes_total{client=\"engine\",result=\"pending\"}".into(),
            3.0,
        ),
        (
            "lookup_first_probe_ready_ratio{client=\"engine\"}".into(),
            4.0 / 7.0,
        ),
        // Every lookup RPC sent: S 2, A 6 (r0 r1 r2 r3, the refresh, r5), T 2.
        (
            "lookup_queue_wait_seconds_count{client=\"engine\"}".into(),
            10.0,
        ),
        ("lookup_in_flight{client=\"engine\"}".into(), 0.0),
        (
            "lookup_prefetch_slots_in_use{client=\"engine\"}".into(),
            0.0,
        ),
        (
            "lookup_socket_reopens_total{client=\"engine\",reason=\"timeouts\"}".into(),
            1.0,
        ),
        (
            "lookup_socket_reopens_total{client=\"engine\",reason=\"reset\"}".into(),
            1.0,
        ),
        (
            "lookup_socket_reopens_total{client=\"engine\",reason=\"error\"}".into(),
            0.0,
        ),
        ("lookup_late_replies_total{client=\"engine\"}".into(), 0.0),
        (
            "lookup_resets_total{client=\"engine\",outcome=\"ok\"}".into(),
            1.0,
        ),
        (
            "lookup_resets_total{client=\"engine\",outcome=\"failed\"}".into(),
            0.0,
        ),
        // Server: lookups A 6 + T 2; keys 2+3+3+3+4+2 + 3+3; one index call each.
        (
            "lookup_server_requests_total{format=\"tagged-blob\",kind=\"lookup\"}".into(),
            8.0,
        ),
        (
            "lookup_server_requests_total{format=\"tagged-blob\",kind=\"reset\"}".into(),
            1.0,
        ),
        (
            "lookup_server_requests_total{format=\"tagged-blob\",kind=\"malformed\"}".into(),
            1.0,
        ),
        (
            "lookup_server_requests_total{format=\"unknown\",kind=\"unknown\"}".into(),
            1.0,
        ),
        (
            "lookup_server_requests_total{format=\"msgpack-hex\",kind=\"lookup\"}".into(),
            0.0,
        ),
        ("lookup_server_keys_checked_total".into(), 23.0),
        ("lookup_server_index_latency_seconds_count".into(), 8.0),
        // Every index call took the delay (200 ms): none under 100 ms, all under 1 s.
        (
            "lookup_server_index_latency_seconds_bucket{le=\"0.1\"}".into(),
            0.0,
        ),
        (
            "lookup_server_index_latency_seconds_bucket{le=\"1\"}".into(),
            8.0,
        ),
        (
            "lookup_server_decode_errors_total{format=\"tagged-blob\"}".into(),
            1.0,
        ),
    ];
    // RPCs by outcome: hits r1+r4 (one RPC), r2, the refresh, T twice; misses r3, r5;
    // r0 stale; r6 cancelled; S's two timed out.
    for (label, n) in [
        ("hit", 5.0),
        ("miss", 2.0),
        ("stale", 1.0),
        ("cancelled", 1.0),
        ("timed_out", 2.0),
        ("failed", 0.0),
        ("malformed", 0.0),
    ] {
        samples.push((outcome("lookup_outcomes_total", label), n));
        if n > 0.0 {
            samples.push((outcome("lookup_latency_seconds_count", label), n));
        }
    }
    let samples: Vec<(&str, f64)> = samples.iter().map(|(s, v)| (s.as_str(), *v)).collect();
    expect(&text, &samples);
    // The timed-out lookups waited the 1 s timeout: both fall between 1 s and 2.5 s.
    expect(
        &text,
        &[
            (
                "lookup_latency_seconds_bucket{client=\"engine\",outcome=\"timed_out\",le=\"0.5\"}",
                0.0,
            ),
            (
                "lookup_latency_seconds_bucket{client=\"engine\",outcome=\"timed_out\",le=\"2.5\"}",
                2.0,
            ),
        ],
    );
    for name in [
        "lookup_latency_seconds",
        "lookup_queue_wait_seconds",
        "lookup_server_index_latency_seconds",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} histogram")),
            "{name} is not a histogram"
        );
    }
    assert!(text.contains("# HELP lookup_first_probe_ready_ratio "));
    // The in-process handle renders the same series.
    assert_eq!(
        value(&handle.render(), "lookup_server_keys_checked_total"),
        Some(23.0)
    );
    server.shutdown().await;
}
