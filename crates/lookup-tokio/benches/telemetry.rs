//! Caller cost of `LookupClient` calls with and without a metrics recorder, under an
//! info-level tracing subscriber (debug spans off, as in production): a probe
//! answered from the result cache (64 hashes), the same inside a debug span (the cost
//! of instrumenting the probe), and an arrival whose queued lookup is
//! cancelled at once by the request's finish (the whole per-lookup bookkeeping: span,
//! open-lookup map, counters, slot gauge, latency histogram).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use lookup_core::{BlockHashes, Probe, Request, RequestId};
use lookup_server::{InMemoryIndex, LookupServer, ServerConfig};
use lookup_tokio::{ClientConfig, Endpoint, KeyLayout, LookupClient};

const B: u32 = 16;

fn request(id: u64) -> Request {
    let chain: Vec<u64> = (0..64).map(|i| id * 1_000 + i).collect();
    Request {
        request_id: RequestId(id),
        num_tokens: 64 * B + 5,
        block_hashes: BlockHashes::from_u64s(&chain),
        skip_reading_external_kv: false,
    }
}

fn config(endpoint: Endpoint) -> ClientConfig {
    let mut config = ClientConfig::zmq(endpoint, B);
    config.core.lookup_async = true;
    config.core.lookup_prefetch_limit = 1 << 20;
    config.core.lookup_prefetch_ttl = Duration::from_secs(3600);
    config.core.lookup_timeout = Duration::from_secs(3600);
    config
}

/// Both measurements with the recorder installed at the time (`label` names it).
fn measure(c: &mut Criterion, runtime: &tokio::runtime::Runtime, label: &str) {
    // A cached probe: the result is in, the probe answers from the cache.
    let layout = KeyLayout::default();
    let index = Arc::new(InMemoryIndex::new());
    let req = request(1);
    index.insert_chain(&layout, &req.block_hashes, 32);
    let server = {
        let _entered = runtime.enter();
        LookupServer::bind(
            &"tcp://127.0.0.1:0".parse().unwrap(),
            ServerConfig::new(B, layout),
            index,
        )
        .unwrap()
    };
    let mut client = LookupClient::connect_lazy_with_handle(
        config(server.local_endpoint().clone()),
        runtime.handle(),
    )
    .unwrap();
    client.on_new_request(&req);
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.probe(&req, 0) == Probe::Pending {
        assert!(Instant::now() < deadline, "no reply");
        std::thread::sleep(Duration::from_millis(1));
    }
    c.bench_function(&format!("probe_cached/{label}"), |b| {
        b.iter(|| black_box(client.probe(black_box(&req), black_box(16))));
    });
    // What `#[tracing::instrument(level = "debug")]` on `probe` would add while debug
    // is off: the reason it is not there.
    c.bench_function(&format!("probe_cached_in_debug_span/{label}"), |b| {
        b.iter(|| {
            let _span = tracing::debug_span!("probe", request_id = req.request_id.0).entered();
            black_box(client.probe(black_box(&req), black_box(16)))
        });
    });
    drop(client);

    // An arrival cancelled at once: nothing listens, so the first lookup stays on the
    // wire (max_in_flight 1) and every later one is queued, then cancelled. The I/O
    // task runs on a current-thread runtime driven every 256 arrivals, on this thread:
    // no cross-thread wake-ups in the measurement, only the caller's work and the
    // task's share of it.
    let local = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint: Endpoint = format!("tcp://127.0.0.1:{port}").parse().unwrap();
    let mut client =
        LookupClient::connect_lazy_with_handle(config(endpoint), local.handle()).unwrap();
    let reqs: Vec<Request> = (2..4098).map(request).collect();
    let mut i = 0usize;
    c.bench_function(&format!("arrival_then_finish/{label}"), |b| {
        b.iter(|| {
            let req = &reqs[i % reqs.len()];
            i += 1;
            client.on_new_request(req);
            client.on_finished(req.request_id);
            if i % 256 == 0 {
                local.block_on(tokio::task::yield_now());
            }
        });
    });
    drop(client);
    local.block_on(tokio::task::yield_now());
    runtime.block_on(server.shutdown());
}

fn benches(c: &mut Criterion) {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::sink)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    measure(c, &runtime, "no_recorder");
    // As `install_prometheus` sets it up, without the listener. Histogram samples
    // pile up until the exporter's upkeep drains them: run it as often as it would
    // (every 5 s), so the bench measures steady state.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&lookup_tokio::metrics::LATENCY_BUCKETS_SECONDS)
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_secs(5));
            handle.run_upkeep();
        }
    });
    metrics::set_global_recorder(recorder).unwrap();
    measure(c, &runtime, "prometheus_recorder");
}

criterion_group!(telemetry, benches);
criterion_main!(telemetry);
