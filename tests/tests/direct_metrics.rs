//! Metrics of the direct transport through the Prometheus recorder: the in-flight
//! gauge while lookups wait at a gated fake master, then outcomes and latency samples
//! once it answers. One test: a process has one global recorder.

use std::net::TcpListener;

use lookup_core::{BlockHashes, Probe};
use lookup_tests::direct::{Behaviour, FakeMaster, eventually, request};
use lookup_tokio::{BatchConfig, ClientConfig, DirectConfig, KeyLayout, LookupClient};

const B: u32 = 16;

/// The value of the sample `series` (name and labels as the exposition writes them).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().expect("a number"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_metrics_gauge_outcomes_and_latency() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let handle = lookup_tokio::metrics::install_prometheus(addr).expect("install");
    let fake = FakeMaster::start(Behaviour::Gated).await;
    let layout = KeyLayout::new("m");
    fake.store(&layout.chain_keys(&BlockHashes::from_u64s(&[1, 2]), 2));
    // Unbatched: both lookups must be on the wire at once, each its own call.
    let mut direct = DirectConfig::parse(&fake.addr, layout).expect("master address");
    direct.batch = BatchConfig::unbatched();
    let mut config = ClientConfig::new(direct, B);
    config.core.lookup_async = true;
    config.client_label = Some("engine".to_owned());
    config.core.lookup_prefetch_limit = 8;
    config.core.max_in_flight = 2;
    let mut client = LookupClient::connect_lazy(config).expect("connect");
    let reqs = [request(1, 3 * B, &[1, 2]), request(2, 3 * B, &[1, 3])];
    for req in &reqs {
        client.on_new_request(req);
    }
    eventually("both lookups at the master", || {
        client.drive();
        fake.outstanding() == 2
    })
    .await;
    let text = handle.render();
    assert_eq!(
        value(&text, "lookup_in_flight{client=\"engine\"}"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "lookup_prefetch_slots_in_use{client=\"engine\"}"),
        Some(2.0)
    );

    fake.open_gate();
    eventually("both lookups answered", || {
        client.drive();
        client.core().open_rpcs() == 0
    })
    .await;
    assert_eq!(
        client.probe(&reqs[0], 0),
        Probe::Ready {
            external_tokens: 32,
            load_async: true
        }
    );
    assert_eq!(
        client.probe(&reqs[1], 0),
        Probe::Ready {
            external_tokens: 16,
            load_async: true
        }
    );
    let text = handle.render();
    for (series, want) in [
        ("lookup_in_flight{client=\"engine\"}", 0.0),
        ("lookup_prefetch_slots_in_use{client=\"engine\"}", 0.0),
        (
            "lookup_outcomes_total{client=\"engine\",outcome=\"hit\"}",
            2.0,
        ),
        (
            "lookup_latency_seconds_count{client=\"engine\",outcome=\"hit\"}",
            2.0,
        ),
        ("lookup_queue_wait_seconds_count{client=\"engine\"}", 2.0),
        (
            "lookup_lookups_total{client=\"engine\",origin=\"arrival\"}",
            2.0,
        ),
        (
            "lookup_first_probes_total{client=\"engine\",result=\"ready\"}",
            2.0,
        ),
    ] {
        assert_eq!(value(&text, series), Some(want), "{series} in:\n{text}");
    }
    client.shutdown().await;
}
