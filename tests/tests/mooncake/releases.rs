//! The other Mooncake releases users run (`spec/mooncake-master-rpc.md`, "Master
//! releases"): each master `scripts/mooncake/install.sh` unpacked (0.3.10 and 0.3.14
//! by default; `$MOONCAKE_RELEASES` names others), started with a 5 s lease, blocks
//! written by a real Python client (0.3.10's own, the pinned one for 0.3.14). A
//! representative subset of what the pinned master is tested for: existence hits and
//! misses against the Python client's own `batch_is_exist`, the keys a probe asks,
//! the lease read, and the router's store check. A missing release fails with the
//! install step.

use std::time::{Duration, Instant};

use lookup_core::BlockHashes;
use lookup_tests::mooncake::release::other_versions;
use lookup_tests::mooncake::{Master, Release, Writer};
use lookup_tokio::mooncake_master::{MasterClient, MasterConfig, MasterError, StoreErrorCode};
use lookup_tokio::{
    DirectConfig, KeyLayout, LeaseSource, LeaseTtl, RankNamespace, StoreCheck, StoredBlocks,
};

/// Block size in tokens.
const B: u32 = 16;
const LEASE: Duration = Duration::from_secs(5);

fn layout() -> KeyLayout {
    KeyLayout::new("Qwen3-8B")
        .with_cache_prefix(Some("vllm".to_owned()))
        .with_namespaces(RankNamespace::grid(2, 1))
        .expect("namespaces")
}

/// Prompt `p`: 4 blocks.
fn chain(p: u64) -> BlockHashes {
    BlockHashes::from_u64s(&(p * 100..p * 100 + 4).collect::<Vec<_>>())
}

fn config() -> MasterConfig {
    let mut config = MasterConfig::default();
    config.call_timeout = Duration::from_secs(5);
    config
}

async fn check_release(release: &Release) {
    let version = &release.version;
    let master = Master::start_release(release, &["-default_kv_lease_ttl=5000".to_owned()]);
    let mut writer = Writer::start_for(&master, release);
    let layout = layout();
    // Prompt 1: 2 of 4 blocks in both namespaces; prompt 2: none.
    let stored = layout.chain_keys(&chain(1), 2);
    writer.put(&stored);

    // BatchExistKey: hits and misses, as the release's own Python client answers.
    let client = MasterClient::connect(master.addr(), config())
        .await
        .unwrap_or_else(|e| panic!("{version}: {e}"));
    let asked = layout.chain_keys(&chain(1), 4);
    let reference: Vec<bool> = writer.exist(&asked).iter().map(|&a| a == 1).collect();
    assert_eq!(
        reference,
        [true, true, true, true, false, false, false, false],
        "{version}: the Python client"
    );
    assert_eq!(
        client.batch_exist(&asked).await.unwrap(),
        reference,
        "{version}"
    );
    // Each call counts its keys once, whatever signature the master takes; only the
    // first call of a client to a master before 0.3.12 is sent twice.
    let refused_first = u64::from(release.python_path.is_some());
    let stats = client.stats();
    assert_eq!(
        (stats.keys_asked, stats.batch_exist_calls, stats.requests),
        (8, 1, 1 + refused_first),
        "{version}"
    );
    let miss = layout.chain_keys(&chain(2), 2);
    let (run, keys) = client.leading_blocks_flat_counted(&miss, 2).await;
    assert_eq!((run.unwrap(), keys), (0, 4), "{version}");
    let after = client.stats();
    assert_eq!(
        (
            after.keys_asked - stats.keys_asked,
            after.requests - stats.requests
        ),
        (4, 1),
        "{version}: the second call goes out in the form the first settled"
    );

    // The lease read.
    assert_eq!(
        client.read_lease(&stored[0]).await.unwrap(),
        LEASE,
        "{version}"
    );
    match client.read_lease(&miss[0]).await {
        Err(MasterError::Store { code, .. }) => {
            assert_eq!(code, StoreErrorCode(-704), "{version}");
        }
        other => panic!("{version}: a missing key must be OBJECT_NOT_FOUND, got {other:?}"),
    }

    // The router's store check, and the lease it goes by once it found a block.
    let direct = DirectConfig::parse(&master.addr(), layout.clone()).unwrap();
    let store = StoreCheck::connect_direct(direct, B).await.unwrap();
    let two = StoredBlocks {
        hit_blocks: 2,
        hit_tokens: 2 * B,
    };
    assert_eq!(store.check(&chain(1)).await, Ok(two), "{version}");
    assert_eq!(
        store.check(&chain(2)).await,
        Ok(StoredBlocks::default()),
        "{version}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let reported = LeaseTtl {
        ttl: LEASE,
        source: LeaseSource::Master,
    };
    while store.lease() != reported {
        assert!(
            Instant::now() < deadline,
            "{version}: the lease is not read: {:?}",
            store.lease()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_other_release_answers_existence_and_reports_its_lease_mooncake_master() {
    let versions = other_versions();
    assert!(!versions.is_empty(), "MOONCAKE_RELEASES names no release");
    for version in versions {
        check_release(&Release::get(&version)).await;
    }
}
