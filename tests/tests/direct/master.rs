//! The direct transport (`Transport::Direct`) against the real `mooncake_master`
//! (PyPI 0.3.13.post1), blocks written by the real Python store client
//! (`mooncake_peers::writer_script`): its answers agree with a `LookupClient` asking our
//! `LookupServer` over ZeroMQ (with `MooncakeIndex` on the same master) and with the
//! reference computation of `spec/wire.md` on 500 random chains; prefetch end to end;
//! a master stopped and restarted mid-run. Needs `scripts/mooncake/install.sh`.

use lookup_tokio::Deadline;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lookup_core::answer::hit_tokens;
use lookup_core::{BlockHashes, Event, LookupOutcome, Probe, Request, RequestId, RpcFailure};
use lookup_server::{LookupServer, MooncakeIndex, ServerConfig};
use lookup_tests::direct::{LIMIT, lookup_outcomes, request};
use lookup_tests::mooncake::{Master, Writer};
use lookup_tokio::mooncake_master::MasterConfig;
use lookup_tokio::{ClientConfig, DirectConfig, Endpoint, KeyLayout, LookupClient, RankNamespace};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tempfile::TempDir;

/// Block size in tokens (vLLM's default).
const B: u32 = 16;
const SEED: u64 = 0x00d1_5ec7;

fn ready(external_tokens: u32) -> Probe {
    Probe::Ready {
        external_tokens,
        load_async: external_tokens > 0,
    }
}

/// A cache prefix, a model name and `tp_size` tensor-parallel namespaces.
fn layout(tp_size: u32) -> KeyLayout {
    KeyLayout::new("Qwen/Qwen3-8B")
        .with_cache_prefix(Some("vllm".to_owned()))
        .with_namespaces(RankNamespace::grid(tp_size, 1))
        .expect("namespaces")
}

fn master_config(chunk_keys: usize) -> MasterConfig {
    let mut config = MasterConfig::default();
    config.chunk_keys = chunk_keys;
    config
}

fn direct_config(master: &Master, layout: &KeyLayout, chunk_keys: usize) -> ClientConfig {
    let mut direct = DirectConfig::parse(&master.addr(), layout.clone()).expect("master address");
    direct.master_config = master_config(chunk_keys);
    ClientConfig::new(direct, B)
}

/// What the scheduler should be told for `num_tokens` tokens of `ids` with a local hit
/// of `computed` tokens, when `stored` holds exactly the store's keys: `spec/wire.md`
/// ("What the server computes") and `spec/behaviour.md` rule 12, written out again.
fn expected(
    layout: &KeyLayout,
    stored: &HashSet<String>,
    ids: &[u64],
    num_tokens: u32,
    computed: u32,
) -> Probe {
    let cap = (num_tokens.saturating_sub(1) / B) * B;
    if ids.is_empty() || cap <= computed {
        return ready(0);
    }
    let asked = ids.len().min((num_tokens / B) as usize);
    let run = ids[..asked]
        .iter()
        .take_while(|&&id| {
            layout
                .block_keys(&id.to_be_bytes())
                .iter()
                .all(|k| stored.contains(k))
        })
        .count();
    let hit = hit_tokens(num_tokens, B, run);
    ready(hit.min(cap).saturating_sub(computed))
}

/// 500 random chains, some sharing prefixes, stored in part (a missing rank, gaps
/// after the run); each asked with a random prompt length and local hit through both
/// transports: the answers are equal, and equal to the reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_and_via_server_agree_on_500_random_chains_mooncake_master() {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let layout = layout(2);
    let master = Master::start();
    let mut writer = Writer::start(&master);

    // Chains: a third continue an earlier chain's prefix, then fresh block ids.
    let mut next_id = 1_000u64;
    let mut chains: Vec<Vec<u64>> = Vec::with_capacity(500);
    let mut stored: HashSet<String> = HashSet::new();
    let mut puts: Vec<String> = Vec::new();
    let mut store = |keys: Vec<String>, stored: &mut HashSet<String>| {
        for key in keys {
            if stored.insert(key.clone()) {
                puts.push(key);
            }
        }
    };
    for _ in 0..500 {
        let len = rng.random_range(0..=12usize);
        let mut ids: Vec<u64> = Vec::with_capacity(len);
        if !chains.is_empty() && rng.random_bool(1.0 / 3.0) {
            let parent = &chains[rng.random_range(0..chains.len())];
            let shared = rng.random_range(0..=parent.len().min(len));
            ids.extend_from_slice(&parent[..shared]);
        }
        while ids.len() < len {
            ids.push(next_id);
            next_id += 1;
        }
        let run = rng.random_range(0..=len);
        for &id in &ids[..run] {
            store(layout.block_keys(&id.to_be_bytes()), &mut stored);
        }
        if run < len && rng.random_bool(0.3) {
            // The next block in rank 0 only: it must not count.
            let keys = layout.block_keys(&ids[run].to_be_bytes());
            store(keys[..1].to_vec(), &mut stored);
        }
        if run + 1 < len && rng.random_bool(0.3) {
            // A stored block after the gap: it must not count either.
            let after = rng.random_range(run + 1..len);
            store(layout.block_keys(&ids[after].to_be_bytes()), &mut stored);
        }
        chains.push(ids);
    }
    let started = Instant::now();
    writer.put(&puts);
    eprintln!("stored {} keys in {:?}", puts.len(), started.elapsed());

    // Via the server: our LookupServer over ipc with MooncakeIndex on the same master,
    // both sides chunking at 6 keys (3 blocks) per BatchExistKey call.
    let dir = TempDir::new().expect("temp dir");
    let index = Arc::new(
        MooncakeIndex::connect(&master.addr(), master_config(6))
            .await
            .expect("index"),
    );
    let server = LookupServer::bind(
        &Endpoint::Ipc(dir.path().join("lookup.sock")),
        ServerConfig::new(B, layout.clone()),
        index.clone(),
    )
    .expect("bind");
    let mut via_server =
        LookupClient::connect_lazy(ClientConfig::zmq(server.local_endpoint().clone(), B))
            .expect("zmq client");
    let mut direct =
        LookupClient::connect_lazy(direct_config(&master, &layout, 6)).expect("direct");

    let mut hits = 0;
    let mut mismatches = Vec::new();
    for (i, ids) in chains.iter().enumerate() {
        let max_tokens = (ids.len() as u32 + 1) * B;
        let num_tokens = rng.random_range(1..max_tokens);
        let computed = B * rng.random_range(0..=2u32);
        let req = request(i as u64, num_tokens, ids);
        let want = expected(&layout, &stored, ids, num_tokens, computed);
        let got_direct = direct.probe_until(&req, computed, Deadline::Answer).await;
        let got_server = via_server
            .probe_until(&req, computed, Deadline::Answer)
            .await;
        direct.on_finished(req.request_id);
        via_server.on_finished(req.request_id);
        if got_direct != want || got_server != want {
            mismatches.push(format!(
                "chain {i} ({} blocks, {num_tokens} tokens, local {computed}): want {want:?}, direct {got_direct:?}, via server {got_server:?}",
                ids.len()
            ));
        }
        if want != ready(0) {
            hits += 1;
        }
    }
    assert!(
        mismatches.is_empty(),
        "seed {SEED:#x}: {} of 500 differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    // The chains exercise both answers.
    assert!(hits > 100 && hits < 400, "{hits} of 500 chains hit");
    let direct_stats = direct.stats();
    let server_stats = via_server.stats();
    // Both sent the same lookups, every one answered.
    assert_eq!(direct_stats.rpcs_sent, server_stats.rpcs_sent);
    assert_eq!(
        direct_stats.core.hits + direct_stats.core.misses,
        direct_stats.rpcs_sent
    );
    assert_eq!(direct_stats.core.hits, server_stats.core.hits);
    // And asked the master the same calls: same keys, same chunks, same early stops.
    let direct_master = direct_stats.master.expect("connected");
    let index_master = index.stats().master;
    assert_eq!(
        direct_master.batch_exist_calls,
        index_master.batch_exist_calls
    );
    assert_eq!(direct_master.keys_asked, index_master.keys_asked);
    via_server.shutdown().await;
    direct.shutdown().await;
    server.shutdown().await;
}

/// Prefetch at arrival through the direct transport: the probe finds the answer ready,
/// the events carry the time on the wire, the counters follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_prefetch_end_to_end_mooncake_master() {
    let layout = layout(1);
    let master = Master::start();
    let mut writer = Writer::start(&master);
    let ids: Vec<u64> = (701..706).collect();
    writer.put(&layout.chain_keys(&BlockHashes::from_u64s(&ids), 3));
    let mut config = direct_config(&master, &layout, 1024);
    config.core.lookup_async = true;
    config.core.lookup_prefetch_limit = 4;
    let mut client = LookupClient::connect_lazy(config).expect("connect");
    let req = request(1, 87, &ids);
    client.on_new_request(&req);
    let deadline = Instant::now() + LIMIT;
    while client.stats().core.hits == 0 {
        assert!(Instant::now() < deadline, "no answer within {LIMIT:?}");
        client.wait_progress(Duration::from_millis(50)).await;
    }
    // Ready at the first probe: 3 blocks of 16 tokens.
    assert_eq!(client.probe(&req, 0), ready(48));
    assert_eq!(
        client.core().ready_at_first_probe(req.request_id),
        Some(true)
    );
    client.on_allocated(req.request_id);
    let mut events = Vec::new();
    while let Some(event) = client.poll_event() {
        if let Event::LookupDone {
            outcome,
            requests,
            total,
            on_wire,
            ..
        } = event
        {
            assert!(on_wire <= total, "{on_wire:?} on the wire of {total:?}");
            events.push((outcome, requests));
        }
    }
    assert_eq!(events, [(LookupOutcome::Hit { hit_tokens: 48 }, 1)]);
    let stats = client.stats();
    assert_eq!(stats.core.lookups_arrival, 1);
    assert_eq!(stats.core.first_probes_ready, 1);
    assert_eq!(stats.slots_in_use, 0);
    let master_stats = stats.master.expect("connected");
    assert_eq!(master_stats.batch_exist_calls, 1);
    assert_eq!(master_stats.keys_asked, 5);
    client.shutdown().await;
}

/// The master killed mid-run: lookups fail open at once (no hang); after a restart on
/// the same port (a fresh master: its keys are gone until written again) they hit again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_master_stopped_fails_open_then_recovers_mooncake_master() {
    let layout = layout(1);
    let mut master = Master::start();
    let mut writer = Writer::start(&master);
    let ids: Vec<u64> = (801..805).collect();
    let keys = layout.chain_keys(&BlockHashes::from_u64s(&ids), ids.len());
    writer.put(&keys);
    let mut client =
        LookupClient::connect_lazy(direct_config(&master, &layout, 1024)).expect("connect");
    let ask = |id: u64| -> Request { request(id, 4 * B + 1, &ids) };
    assert_eq!(
        client.probe_until(&ask(1), 0, Deadline::Answer).await,
        ready(64)
    );
    client.on_finished(RequestId(1));

    drop(writer);
    master.stop();
    let started = Instant::now();
    assert_eq!(
        client.probe_until(&ask(2), 0, Deadline::Answer).await,
        ready(0)
    );
    // Failing open takes a failed call, never the lookup timeout (5 s).
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    client.on_finished(RequestId(2));
    let outcomes = lookup_outcomes(&mut client);
    assert_eq!(
        outcomes.last(),
        Some(&LookupOutcome::Failed(RpcFailure::Transport)),
        "{outcomes:?}"
    );

    let restarted = Master::start_on(master.rpc_port());
    let mut writer = Writer::start(&restarted);
    writer.put(&keys);
    let deadline = Instant::now() + LIMIT;
    let mut id = 3;
    loop {
        let answer = client.probe_until(&ask(id), 0, Deadline::Answer).await;
        client.on_finished(RequestId(id));
        if answer == ready(64) {
            break;
        }
        assert_eq!(answer, ready(0));
        assert!(Instant::now() < deadline, "no recovery within {LIMIT:?}");
        id += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = client.stats();
    assert!(stats.core.failed_transport >= 1, "{stats:?}");
    // The connection to the first master was lost and a new one made; a master that
    // is still starting may drop a fresh connection once more, so at least.
    let master_stats = stats.master.expect("connected");
    assert!(master_stats.connections_lost >= 1, "{master_stats:?}");
    assert!(master_stats.connects >= 2, "{master_stats:?}");
    client.shutdown().await;
}
