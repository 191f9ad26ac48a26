//! The master's read lease, read from the real `mooncake_master` (PyPI 0.3.13.post1)
//! started with `-default_kv_lease_ttl=5000`, and what goes by it: the direct
//! transport's TTL warning and presence cache, and the server's check of its clients'
//! TTL (`spec/mooncake-master-rpc.md`, "Where the lease can be read"; the bug: a result
//! cached past the real lease was served after its keys were removed). Needs
//! `scripts/mooncake/install.sh`.

use lookup_tokio::Deadline;
use std::time::{Duration, Instant};

use lookup_core::{BlockHashes, Probe, Request, RequestId};
use lookup_server::{BlockIndex, MooncakeIndex};
use lookup_tests::logs::Logs;
use lookup_tests::mooncake::{Master, Writer, free_port};
use lookup_tokio::mooncake_master::{MasterClient, MasterConfig, MasterError, StoreErrorCode};
use lookup_tokio::{
    ClientConfig, DirectConfig, KeyLayout, LeaseSource, LeaseTtl, LookupClient, RankNamespace,
};

/// Block size in tokens (vLLM's default).
const B: u32 = 16;
const LEASE: Duration = Duration::from_secs(5);
const LIMIT: Duration = Duration::from_secs(20);

fn five_second_master() -> Master {
    let mut master = Master::spawn(free_port(), &["-default_kv_lease_ttl=5000".to_owned()]);
    master.wait_ready(20);
    master
}

fn layout() -> KeyLayout {
    KeyLayout::new("Qwen3-8B")
        .with_cache_prefix(Some("vllm".to_owned()))
        .with_namespaces(RankNamespace::grid(2, 1))
        .expect("namespaces")
}

/// Four blocks `salt..salt+4`, written in both namespaces; the prompt is one token
/// longer, so all four count (`spec/wire.md`).
fn written(writer: &mut Writer, layout: &KeyLayout, salt: u64) -> (Vec<u64>, Vec<String>) {
    let ids: Vec<u64> = (salt..salt + 4).collect();
    let keys = layout.chain_keys(&BlockHashes::from_u64s(&ids), ids.len());
    writer.put(&keys);
    (ids, keys)
}

fn request(id: u64, ids: &[u64]) -> Request {
    Request {
        request_id: RequestId(id),
        num_tokens: 4 * B + 1,
        block_hashes: BlockHashes::from_u64s(ids),
        skip_reading_external_kv: false,
    }
}

fn hit(external_tokens: u32) -> Probe {
    Probe::Ready {
        external_tokens,
        load_async: external_tokens > 0,
    }
}

fn direct_client(master: &Master, ttl: Duration, presence: bool) -> LookupClient {
    let mut direct = DirectConfig::parse(&master.addr(), layout()).expect("master address");
    direct.batch.presence.enabled = presence;
    let mut config = ClientConfig::new(direct, B);
    config.core.lookup_prefetch_ttl = ttl;
    LookupClient::connect_lazy(config).expect("connect")
}

async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !check() {
        assert!(Instant::now() < deadline, "not within {LIMIT:?}: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

const MASTER_5S: LeaseTtl = LeaseTtl {
    ttl: LEASE,
    source: LeaseSource::Master,
};

#[tokio::test]
async fn get_replica_list_reports_the_lease_the_master_runs_with_mooncake_master() {
    let short = five_second_master();
    let default = Master::start();
    for (master, lease) in [(&short, LEASE), (&default, Duration::from_secs(10))] {
        let mut writer = Writer::start(master);
        writer.put(&["lease-probe"]);
        let client = MasterClient::connect(master.addr(), MasterConfig::default())
            .await
            .expect("connect");
        assert_eq!(
            client.read_lease("lease-probe").await.expect("lease"),
            lease
        );
        let list = client.get_replica_list("lease-probe").await.expect("list");
        assert_eq!((list.replicas.len(), list.object_checksum), (1, None));
        match client.read_lease("never-written").await {
            Err(MasterError::Store { code, key_index }) => {
                assert_eq!((code, key_index), (StoreErrorCode(-704), Some(0)));
            }
            other => panic!("a missing key must be OBJECT_NOT_FOUND, got {other:?}"),
        }
    }
}

/// `lookup_prefetch_ttl_s` 6 s is below the configured 10 s (no warning at connect)
/// but not below the master's real 5 s: warned once the first hit read it.
#[tokio::test]
async fn the_direct_transport_warns_against_the_masters_own_lease_mooncake_master() {
    let master = five_second_master();
    let mut writer = Writer::start(&master);
    let (ids, _) = written(&mut writer, &layout(), 0x1000);
    let logs = Logs::capture();
    let mut client = direct_client(&master, Duration::from_secs(6), false);
    assert_eq!(
        client
            .probe_until(&request(1, &ids), 0, Deadline::Answer)
            .await,
        hit(4 * B)
    );
    until("the lease is read", || {
        client.master_lease() == Some(MASTER_5S)
    })
    .await;
    let warnings = logs.containing("is not below");
    assert_eq!(warnings.len(), 1, "{:#?}", logs.lines());
    assert!(
        warnings[0].contains(
            "WARN mooncake_master::batch::lease: lookup_prefetch_ttl_s of 6 s is not below \
             the Mooncake master's read lease (5 s, reported by the master): a cached result \
             may name blocks evicted since; set it below the lease"
        ),
        "{}",
        warnings[0]
    );
    assert_eq!(
        logs.containing("the Mooncake master reports a read lease of 5 s")
            .len(),
        1
    );
    assert_eq!(client.batch_stats().expect("connected").lease_reads, 1);
}

/// Keys answered present at t0 are leased until t0 + 5 s. Removed after that, they
/// must not be taken from the presence cache, which the configured 10 s alone would
/// still trust.
#[tokio::test]
async fn the_presence_cache_ends_with_the_masters_lease_not_the_configured_one_mooncake_master() {
    let master = five_second_master();
    let mut writer = Writer::start(&master);
    let (ids, keys) = written(&mut writer, &layout(), 0x2000);
    let mut client = direct_client(&master, Duration::from_millis(500), true);
    let asked = Instant::now();
    assert_eq!(
        client
            .probe_until(&request(1, &ids), 0, Deadline::Answer)
            .await,
        hit(4 * B)
    );
    until("the lease is read", || {
        client.master_lease() == Some(MASTER_5S)
    })
    .await;
    tokio::time::sleep_until((asked + LEASE + Duration::from_millis(600)).into()).await;
    let admin = MasterClient::connect(master.addr(), MasterConfig::default())
        .await
        .expect("connect");
    // Without force only objects whose lease ended go: all of them by now.
    assert_eq!(
        admin.remove_all(false).await.expect("remove"),
        keys.len() as i64
    );
    assert_eq!(
        client
            .probe_until(&request(2, &ids), 0, Deadline::Answer)
            .await,
        hit(0)
    );
    let stats = client.batch_stats().expect("connected");
    assert_eq!((stats.keys_from_cache, stats.lease_reads), (0, 1));
}

/// The server behind the ZeroMQ wire checks its clients' TTL: at once against the
/// configured lease, and against the master's own once read.
#[tokio::test]
async fn the_server_checks_its_clients_ttl_against_the_masters_lease_mooncake_master() {
    let master = five_second_master();
    let mut writer = Writer::start(&master);
    let (_, keys) = written(&mut writer, &layout(), 0x3000);
    let logs = Logs::capture();
    let index = MooncakeIndex::connect(&master.addr(), MasterConfig::default())
        .await
        .expect("connect")
        .with_lease_ttl(Duration::from_secs(4))
        .check_client_ttl(Duration::from_secs(4));
    assert_eq!(
        index.lease(),
        LeaseTtl {
            ttl: Duration::from_secs(4),
            source: LeaseSource::Configured
        }
    );
    let run = index.leading_blocks(2, &keys).await.expect("lookup");
    assert_eq!(run.blocks, 4);
    until("the lease is read", || index.lease() == MASTER_5S).await;
    let warnings = logs.containing("is not below");
    assert_eq!(warnings.len(), 1, "{:#?}", logs.lines());
    assert!(
        warnings[0].contains(
            "the clients' lookup_prefetch_ttl_s (--client-ttl-s) of 4 s is not below the \
             Mooncake master's read lease (4 s, configured)"
        ),
        "{}",
        warnings[0]
    );
    let checked = MooncakeIndex::connect(&master.addr(), MasterConfig::default())
        .await
        .expect("connect")
        .check_client_ttl(Duration::from_secs(6));
    assert_eq!(
        logs.containing("is not below").len(),
        1,
        "6 s < 10 s configured"
    );
    assert_eq!(
        checked
            .leading_blocks(2, &keys)
            .await
            .expect("lookup")
            .blocks,
        4
    );
    until("the lease is read", || checked.lease() == MASTER_5S).await;
    let warnings = logs.containing("is not below");
    assert_eq!(warnings.len(), 2, "{:#?}", logs.lines());
    assert!(
        warnings[1].contains(
            "the clients' lookup_prefetch_ttl_s (--client-ttl-s) of 6 s is not below the \
             Mooncake master's read lease (5 s, reported by the master)"
        ),
        "{}",
        warnings[1]
    );
}
