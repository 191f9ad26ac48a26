//! The lease checks of both transports against fakes (`spec/mooncake-master-rpc.md`,
//! "Where the lease can be read"): the direct transport reads the master's lease once
//! at the first hit, goes by it, and warns when the master cannot report it; the
//! ZeroMQ transport, whose wire carries no lease, checks against
//! `ZmqConfig::store_lease_ttl`.

use lookup_tokio::Deadline;
use std::time::Duration;

use lookup_core::{BlockHashes, Probe};
use lookup_tests::client::free_tcp;
use lookup_tests::direct::{Behaviour, FakeMaster, eventually, request};
use lookup_tests::logs::Logs;
use lookup_tokio::{
    ClientConfig, DirectConfig, KeyLayout, LeaseSource, LeaseTtl, LookupClient, RankNamespace,
    ZmqConfig,
};

const B: u32 = 16;

fn layout() -> KeyLayout {
    KeyLayout::new("m")
        .with_cache_prefix(Some("p".to_owned()))
        .with_namespaces(RankNamespace::grid(2, 1))
        .expect("namespaces")
}

fn hit(external_tokens: u32) -> Probe {
    Probe::Ready {
        external_tokens,
        load_async: external_tokens > 0,
    }
}

/// A fake with blocks 1-3 stored and a direct client with `lookup_prefetch_ttl_s` 2 s.
async fn stored_and_client() -> (std::sync::Arc<FakeMaster>, LookupClient) {
    let fake = FakeMaster::start(Behaviour::Answer).await;
    fake.store(&layout().chain_keys(&BlockHashes::from_u64s(&[1, 2, 3]), 3));
    let direct = DirectConfig::parse(&fake.addr, layout()).expect("master address");
    let client = LookupClient::connect_lazy(ClientConfig::new(direct, B)).expect("connect");
    (fake, client)
}

#[tokio::test]
async fn a_master_that_cannot_report_its_lease_is_warned_about_once() {
    let logs = Logs::capture();
    let (fake, mut client) = stored_and_client().await;
    assert_eq!(
        client
            .probe_until(&request(1, 49, &[1, 2, 3]), 0, Deadline::Answer)
            .await,
        hit(48)
    );
    eventually("the lease is asked", || fake.lease_calls() == 1).await;
    eventually("the refusal is recorded", || {
        !logs.containing("cannot read").is_empty()
    })
    .await;
    assert_eq!(
        client
            .probe_until(&request(2, 49, &[1, 2, 3]), 0, Deadline::Answer)
            .await,
        hit(48)
    );
    assert_eq!(fake.lease_calls(), 1, "a refusal is not asked again");
    assert_eq!(
        client.master_lease(),
        Some(LeaseTtl {
            ttl: Duration::from_secs(10),
            source: LeaseSource::Configured
        })
    );
    let warnings = logs.containing("cannot read");
    assert_eq!(warnings.len(), 1, "{:#?}", logs.lines());
    assert!(
        warnings[0].contains(
            "WARN mooncake_master::batch::lease: cannot read the Mooncake master's read lease \
             (the Mooncake master does not register function GetReplicaList (0x1f7ef174): the \
             rpc function not registered); going by the configured lease of 10 s"
        ),
        "{}",
        warnings[0]
    );
    assert_eq!(client.batch_stats().expect("connected").lease_reads, 0);
}

#[tokio::test]
async fn a_reported_lease_below_the_ttl_is_warned_about() {
    let logs = Logs::capture();
    let (fake, mut client) = stored_and_client().await;
    fake.report_lease(Duration::from_millis(1500));
    assert!(
        logs.containing("is not below").is_empty(),
        "2 s < 10 s configured"
    );
    assert_eq!(
        client
            .probe_until(&request(1, 49, &[1, 2, 3]), 0, Deadline::Answer)
            .await,
        hit(48)
    );
    let reported = LeaseTtl {
        ttl: Duration::from_millis(1500),
        source: LeaseSource::Master,
    };
    eventually("the lease is read", || {
        client.master_lease() == Some(reported)
    })
    .await;
    let warnings = logs.containing("is not below");
    assert_eq!(warnings.len(), 1, "{:#?}", logs.lines());
    assert!(
        warnings[0].contains(
            "lookup_prefetch_ttl_s of 2 s is not below the Mooncake master's read lease (1.5 \
             s, reported by the master)"
        ),
        "{}",
        warnings[0]
    );
    assert_eq!(fake.lease_calls(), 1);
}

/// A TTL at or above the configured lease is warned about as soon as the master
/// connects, before any lease was read.
#[tokio::test]
async fn a_ttl_not_below_the_configured_lease_is_warned_about_at_connect() {
    let logs = Logs::capture();
    let fake = FakeMaster::start(Behaviour::Answer).await;
    let direct = DirectConfig::parse(&fake.addr, layout()).expect("master address");
    let mut config = ClientConfig::new(direct, B);
    config.core.lookup_prefetch_ttl = Duration::from_secs(10);
    let mut client = LookupClient::connect_lazy(config).expect("connect");
    assert_eq!(
        client
            .probe_until(&request(1, 49, &[1, 2, 3]), 0, Deadline::Answer)
            .await,
        hit(0)
    );
    let warnings = logs.containing("is not below");
    assert_eq!(warnings.len(), 1, "{:#?}", logs.lines());
    assert!(
        warnings[0].contains(
            "lookup_prefetch_ttl_s of 10 s is not below the Mooncake master's read lease (10 \
             s, configured)"
        ),
        "{}",
        warnings[0]
    );
    assert_eq!(fake.lease_calls(), 0, "a miss reads no lease");
}

/// Once per cause: a TTL warned about at connect against the configured lease (10 s)
/// is not warned about again when the master reports a lease it also outlives (5 s).
#[tokio::test]
async fn a_ttl_above_both_leases_is_warned_about_once() {
    let logs = Logs::capture();
    let fake = FakeMaster::start(Behaviour::Answer).await;
    fake.store(&layout().chain_keys(&BlockHashes::from_u64s(&[1, 2, 3]), 3));
    fake.report_lease(Duration::from_secs(5));
    let direct = DirectConfig::parse(&fake.addr, layout()).expect("master address");
    let mut config = ClientConfig::new(direct, B);
    config.core.lookup_prefetch_ttl = Duration::from_secs(10);
    let mut client = LookupClient::connect_lazy(config).expect("connect");
    assert_eq!(
        client
            .probe_until(&request(1, 49, &[1, 2, 3]), 0, Deadline::Answer)
            .await,
        hit(48)
    );
    let reported = LeaseTtl {
        ttl: Duration::from_secs(5),
        source: LeaseSource::Master,
    };
    eventually("the lease is read", || {
        client.master_lease() == Some(reported)
    })
    .await;
    let warnings = logs.containing("is not below");
    assert_eq!(warnings.len(), 1, "{:#?}", logs.lines());
    assert!(
        warnings[0].contains("(10 s, configured)"),
        "{}",
        warnings[0]
    );
}

#[tokio::test]
async fn the_zeromq_client_checks_the_store_lease_it_is_given() {
    let logs = Logs::capture();
    let mut zmq = ZmqConfig::new(free_tcp());
    let endpoint = zmq.endpoint.url();
    zmq.store_lease_ttl = Some(Duration::from_secs(5));
    let _below = LookupClient::connect_lazy(ClientConfig::new(zmq.clone(), B)).expect("connect");
    assert!(logs.containing("is not below").is_empty(), "2 s < 5 s");
    zmq.store_lease_ttl = Some(Duration::from_secs(2));
    let _at = LookupClient::connect_lazy(ClientConfig::new(zmq, B)).expect("connect");
    let warnings = logs.containing("is not below");
    assert_eq!(warnings.len(), 1, "{:#?}", logs.lines());
    assert!(
        warnings[0].contains(&format!(
            "WARN lookup_tokio::transport: lookup_prefetch_ttl_s of 2 s is not below the store's \
             read lease (2 s, ZmqConfig::store_lease_ttl): a cached result may name blocks \
             evicted since; set it below the lease endpoint={endpoint} ttl_s=2.0 lease_ttl_s=2.0"
        )),
        "{}",
        warnings[0]
    );
}
