//! Batching across lookups and the presence cache against the real `mooncake_master`,
//! blocks written by the real Python store client: batched answers equal unbatched
//! answers (and the reference of `spec/wire.md`) on 1,000 random chains in three key
//! layouts that share prefixes, both through [`Coalescer`] and through a direct
//! `LookupClient` fed in bursts; the cache asks only for the unknown tail, with exact
//! key counts, and is dropped on a reset and on a failed call. Needs
//! `scripts/mooncake/install.sh`.

use lookup_tokio::Deadline;
use std::collections::HashSet;
use std::time::Duration;

use lookup_core::answer::hit_tokens;
use lookup_core::{BlockHashes, Probe};
use lookup_tests::direct::request;
use lookup_tests::mooncake::{Master, Writer};
use lookup_tokio::mooncake_master::batch::{DEFAULT_LEASE_TTL, LeaseSource};
use lookup_tokio::mooncake_master::{BatchConfig, Coalescer, MasterClient, MasterConfig};
use lookup_tokio::{ClientConfig, DirectConfig, KeyLayout, LookupClient, RankNamespace};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Block size in tokens (vLLM's default).
const B: u32 = 16;
const SEED: u64 = 0x0ba7_c4ed;
const CHAINS: usize = 1_000;

fn layout(model: &str, tp_size: u32) -> KeyLayout {
    KeyLayout::new(model)
        .with_cache_prefix(Some("vllm".to_owned()))
        .with_namespaces(RankNamespace::grid(tp_size, 1))
        .expect("namespaces")
}

/// Three deployments on one store: 1, 2 and 4 rank namespaces.
fn layouts() -> Vec<KeyLayout> {
    vec![
        layout("Qwen/Qwen3-8B", 1),
        layout("Qwen/Qwen3-8B", 2),
        layout("meta-llama/Llama-3.1-70B", 4),
    ]
}

fn master_config(chunk_keys: usize) -> MasterConfig {
    let mut config = MasterConfig::default();
    config.chunk_keys = chunk_keys;
    config
}

/// One random chain: its layout, block ids.
struct Chain {
    layout: usize,
    ids: Vec<u64>,
}

/// 1,000 chains: half continue an earlier chain's prefix (same ids, maybe another
/// layout); stored in part, with a missing rank and stored blocks after the gap.
/// Returns the chains and the keys written.
fn chains(rng: &mut ChaCha8Rng, layouts: &[KeyLayout]) -> (Vec<Chain>, HashSet<String>) {
    let mut next_id = 1u64;
    let mut chains: Vec<Chain> = Vec::with_capacity(CHAINS);
    let mut stored = HashSet::new();
    for _ in 0..CHAINS {
        let len = rng.random_range(0..=24usize);
        let mut ids = Vec::with_capacity(len);
        let mut which = rng.random_range(0..layouts.len());
        if !chains.is_empty() && rng.random_bool(0.5) {
            let parent = &chains[rng.random_range(0..chains.len())];
            let shared = rng.random_range(0..=parent.ids.len().min(len));
            ids.extend_from_slice(&parent.ids[..shared]);
            if rng.random_bool(0.8) {
                which = parent.layout;
            }
        }
        while ids.len() < len {
            ids.push(next_id);
            next_id += 1;
        }
        let layout = &layouts[which];
        let run = rng.random_range(0..=len);
        for id in &ids[..run] {
            stored.extend(layout.block_keys(&id.to_be_bytes()));
        }
        if run < len && rng.random_bool(0.3) {
            let keys = layout.block_keys(&ids[run].to_be_bytes());
            stored.insert(keys[0].clone());
        }
        if run + 1 < len && rng.random_bool(0.3) {
            let after = rng.random_range(run + 1..len);
            stored.extend(layout.block_keys(&ids[after].to_be_bytes()));
        }
        chains.push(Chain { layout: which, ids });
    }
    (chains, stored)
}

fn keys_of(layouts: &[KeyLayout], chain: &Chain) -> Vec<String> {
    let hashes = BlockHashes::from_u64s(&chain.ids);
    layouts[chain.layout].chain_keys(&hashes, chain.ids.len())
}

/// The reference leading run: blocks whose every namespace key is stored.
fn reference(layouts: &[KeyLayout], stored: &HashSet<String>, chain: &Chain) -> usize {
    chain
        .ids
        .iter()
        .take_while(|id| {
            layouts[chain.layout]
                .block_keys(&id.to_be_bytes())
                .iter()
                .all(|k| stored.contains(k))
        })
        .count()
}

fn put_all(writer: &mut Writer, stored: &HashSet<String>) {
    let mut keys: Vec<&String> = stored.iter().collect();
    keys.sort_unstable();
    writer.put(&keys);
}

/// Batched answers equal unbatched answers on 1,000 random chains: the chains go to a
/// `Coalescer` in bursts of 1 to 64 flushed together, and one by one to
/// `leading_blocks_flat` (chunks of 8 keys, so runs take several rounds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_answers_equal_unbatched_answers_on_1000_random_chains_mooncake_master() {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let layouts = layouts();
    let (chains, stored) = chains(&mut rng, &layouts);
    let master = Master::start();
    let mut writer = Writer::start(&master);
    put_all(&mut writer, &stored);

    let unbatched = MasterClient::connect(master.addr(), master_config(8))
        .await
        .expect("connect");
    let mut alone = Vec::with_capacity(CHAINS);
    for chain in &chains {
        let kpb = layouts[chain.layout].namespaces().len();
        let run = unbatched
            .leading_blocks_flat(&keys_of(&layouts, chain), kpb)
            .await
            .expect("unbatched query");
        alone.push(run);
    }
    let u = unbatched.stats();

    let batched = MasterClient::connect(master.addr(), master_config(8))
        .await
        .expect("connect");
    // A burst is one batch: no lookup gives up waiting, however slow this machine is.
    let mut batch = BatchConfig::default();
    batch.max_wait = Duration::from_secs(10);
    let coalescer = Coalescer::new(batched.clone(), batch, DEFAULT_LEASE_TTL, Duration::ZERO);
    let mut together = Vec::with_capacity(CHAINS);
    let mut start = 0;
    let mut bursts = 0;
    while start < CHAINS {
        let end = (start + rng.random_range(1..=64usize)).min(CHAINS);
        let pending: Vec<_> = chains[start..end]
            .iter()
            .map(|chain| {
                coalescer.submit(
                    keys_of(&layouts, chain),
                    layouts[chain.layout].namespaces().len(),
                )
            })
            .collect();
        coalescer.flush();
        for answer in futures::future::join_all(pending.into_iter().map(|p| p.wait())).await {
            together.push(answer.expect("batched query"));
        }
        bursts += 1;
        start = end;
        // The batch task that answered this burst may still look for more: the next
        // burst goes once it has stopped, so that it is one batch of its own.
        while coalescer.batches_in_flight() > 0 {
            tokio::task::yield_now().await;
        }
    }
    let b = batched.stats();
    let s = coalescer.stats();

    let mut mismatches = Vec::new();
    for (i, chain) in chains.iter().enumerate() {
        let want = reference(&layouts, &stored, chain);
        if alone[i] != want || together[i] != want {
            mismatches.push(format!(
                "chain {i} (layout {}, {} blocks): reference {want}, unbatched {}, batched {}",
                chain.layout,
                chain.ids.len(),
                alone[i],
                together[i]
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "seed {SEED:#x}: {} of {CHAINS} differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    let hits = alone.iter().filter(|&&run| run > 0).count();
    assert!(hits > 300 && hits < 950, "{hits} of {CHAINS} chains hit");
    eprintln!(
        "unbatched: {} calls, {} keys; batched in {bursts} bursts: {} batches, {} calls, {} keys",
        u.batch_exist_calls, u.keys_asked, s.batches, b.batch_exist_calls, b.keys_asked
    );
    // Each lookup was answered once, in one batch per burst at most.
    assert_eq!(s.lookups, CHAINS as u64);
    assert!(
        s.batches <= bursts,
        "{} batches for {bursts} bursts",
        s.batches
    );
    assert_eq!(s.keys_asked, b.keys_asked);
    // Shared prefixes are asked once: fewer keys, and no more calls (with 8-key chunks
    // the calls are bound by keys; the direct client's test shows the calls saved).
    assert!(
        b.keys_asked < u.keys_asked,
        "{} >= {}",
        b.keys_asked,
        u.keys_asked
    );
    assert!(
        b.batch_exist_calls <= u.batch_exist_calls,
        "{} calls batched, {} unbatched",
        b.batch_exist_calls,
        u.batch_exist_calls
    );
}

fn direct(
    master: &Master,
    layout: &KeyLayout,
    batch: BatchConfig,
    chunk_keys: usize,
) -> ClientConfig {
    let mut direct = DirectConfig::parse(&master.addr(), layout.clone()).expect("master address");
    direct.master_config = master_config(chunk_keys);
    direct.batch = batch;
    let mut config = ClientConfig::new(direct, B);
    config.core.lookup_async = true;
    config.core.lookup_prefetch_limit = 64;
    config.core.max_in_flight = 64;
    config
}

fn ready(external_tokens: u32) -> Probe {
    Probe::Ready {
        external_tokens,
        load_async: external_tokens > 0,
    }
}

/// The same through `LookupClient`s on the direct transport, one batched and one not,
/// fed 1,000 chains of one 2-namespace layout in bursts of arrivals
/// (prefetch), then probed: every answer equal, and equal to the reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_direct_client_answers_bursts_as_an_unbatched_one_mooncake_master() {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED ^ 1);
    let layouts = vec![layout("Qwen/Qwen3-8B", 2)];
    let (chains, stored) = chains(&mut rng, &layouts);
    let master = Master::start();
    let mut writer = Writer::start(&master);
    put_all(&mut writer, &stored);
    let mut batched =
        LookupClient::connect_lazy(direct(&master, &layouts[0], BatchConfig::default(), 1024))
            .expect("batched");
    let mut unbatched =
        LookupClient::connect_lazy(direct(&master, &layouts[0], BatchConfig::unbatched(), 1024))
            .expect("unbatched");
    let mut start = 0;
    let mut mismatches = Vec::new();
    while start < CHAINS {
        let end = (start + rng.random_range(1..=64usize)).min(CHAINS);
        let reqs: Vec<_> = (start..end)
            .map(|i| {
                let ids = &chains[i].ids;
                let num_tokens = rng.random_range(1..(ids.len() as u32 + 1) * B + 1);
                request(i as u64, num_tokens, ids)
            })
            .collect();
        for req in &reqs {
            batched.on_new_request(req);
            unbatched.on_new_request(req);
        }
        for (req, i) in reqs.iter().zip(start..end) {
            let run = reference(&layouts, &stored, &chains[i]);
            let cap = (req.num_tokens.saturating_sub(1) / B) * B;
            let full = (req.num_tokens / B) as usize;
            let want = ready(hit_tokens(req.num_tokens, B, run.min(full)).min(cap));
            let got_batched = batched.probe_until(req, 0, Deadline::Answer).await;
            let got_unbatched = unbatched.probe_until(req, 0, Deadline::Answer).await;
            if got_batched != want || got_unbatched != want {
                mismatches.push(format!(
                    "chain {i}: want {want:?}, batched {got_batched:?}, unbatched {got_unbatched:?}"
                ));
            }
            batched.on_finished(req.request_id);
            unbatched.on_finished(req.request_id);
        }
        start = end;
    }
    assert!(
        mismatches.is_empty(),
        "seed {:#x}: {} differ:\n{}",
        SEED ^ 1,
        mismatches.len(),
        mismatches.join("\n")
    );
    let b = batched.batch_stats().expect("connected");
    let u = unbatched.batch_stats().expect("connected");
    eprintln!("batched client: {b:?}\nunbatched client: {u:?}");
    assert_eq!(b.lookups, u.lookups);
    assert_eq!(u.batches, u.lookups);
    assert!(
        b.batches * 2 < b.lookups,
        "{} batches for {} lookups",
        b.batches,
        b.lookups
    );
    let bm = batched.stats().master.expect("connected");
    let um = unbatched.stats().master.expect("connected");
    eprintln!("batched master calls: {bm:?}\nunbatched master calls: {um:?}");
    assert!(bm.keys_asked < um.keys_asked);
    // One call per unbatched lookup; one per batch batched (1,024-key chunks).
    assert_eq!(um.batch_exist_calls, u.lookups);
    assert!(bm.batch_exist_calls * 4 < um.batch_exist_calls);
    batched.close();
    unbatched.close();
}

/// The presence cache asks only for the unknown tail (exact key counts), and is
/// dropped on a reset and when the master's connection ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_presence_cache_asks_only_the_unknown_tail_mooncake_master() {
    let layout = layout("Qwen/Qwen3-8B", 2);
    let mut master = Master::start();
    let mut writer = Writer::start(&master);
    let ids: Vec<u64> = (1..=12).collect();
    // Blocks 1-10 stored (20 keys); 11 and 12 absent.
    let stored: Vec<String> = ids[..10]
        .iter()
        .flat_map(|id| layout.block_keys(&id.to_be_bytes()))
        .collect();
    writer.put(&stored);
    let mut batch = BatchConfig::default();
    batch.presence.enabled = true;
    let config = direct(&master, &layout, batch, 1024);
    let mut client = LookupClient::connect_lazy(config).expect("client");
    let keys_asked = |client: &mut LookupClient| client.stats().master.map_or(0, |m| m.keys_asked);

    // A prompt of 6 blocks (97 tokens): 12 keys asked, all present.
    let first = request(1, 6 * B + 1, &ids[..6]);
    assert_eq!(
        client.probe_until(&first, 0, Deadline::Answer).await,
        ready(6 * B)
    );
    assert_eq!(keys_asked(&mut client), 12);
    // Nothing is cached before this connection's lease is read (at the first hit).
    lookup_tests::direct::eventually("the master's lease read", || {
        client
            .master_lease()
            .is_some_and(|l| l.source == LeaseSource::Master)
    })
    .await;
    assert_eq!(client.batch_stats().expect("connected").keys_from_cache, 0);
    let warm = request(6, 6 * B + 1, &ids[..6]);
    assert_eq!(
        client.probe_until(&warm, 0, Deadline::Answer).await,
        ready(6 * B)
    );
    assert_eq!(keys_asked(&mut client), 24);
    // Its continuation to 12 blocks: only blocks 7-12 are asked (12 keys: block 7
    // first, after the cached prefix, then blocks 8-12); the run ends at block 11, as
    // without the cache.
    let cont = request(2, 12 * B + 1, &ids);
    assert_eq!(
        client.probe_until(&cont, 0, Deadline::Answer).await,
        ready(10 * B)
    );
    assert_eq!(keys_asked(&mut client), 36);
    let s = client.batch_stats().expect("connected");
    assert_eq!(s.keys_from_cache, 12);
    // Another prompt sharing the first 8 blocks, then its own: the 8 shared ones (16
    // keys) come from the cache, and only the block after them is asked (2 keys): it
    // is absent, so the block behind it is never asked.
    let mut other_ids = ids[..8].to_vec();
    other_ids.extend([100, 101]);
    let other = request(3, 10 * B + 1, &other_ids);
    assert_eq!(
        client.probe_until(&other, 0, Deadline::Answer).await,
        ready(8 * B)
    );
    assert_eq!(keys_asked(&mut client), 38);
    assert_eq!(client.batch_stats().expect("connected").keys_from_cache, 28);

    // A reset drops the cache: the same prompt asks all 12 keys again.
    let _ = client.reset();
    client.wait_progress(Duration::from_millis(200)).await;
    let again = request(4, 6 * B + 1, &ids[..6]);
    assert_eq!(
        client.probe_until(&again, 0, Deadline::Answer).await,
        ready(6 * B)
    );
    assert_eq!(keys_asked(&mut client), 50);
    assert_eq!(client.batch_stats().expect("connected").keys_from_cache, 28);

    // A failed call (the master stopped) drops it too: once the master is back with the
    // same blocks, everything is asked again.
    let port = master.rpc_port();
    let lost = client.stats().master.map_or(0, |m| m.connections_lost);
    drop(writer);
    master.stop();
    lookup_tests::direct::eventually("the connection seen closed", || {
        client
            .stats()
            .master
            .is_some_and(|m| m.connections_lost > lost)
    })
    .await;
    let failed = request(5, 12 * B + 1, &ids);
    assert_eq!(
        client.probe_until(&failed, 0, Deadline::Answer).await,
        ready(0)
    );
    let s = client.batch_stats().expect("connected");
    assert_eq!(s.cache_drops, 2, "a reset and the connection's end");
    // The connection's epoch ended with it: nothing came from the cache.
    assert_eq!(s.keys_from_cache, 28);
    let master = Master::start_on(port);
    let mut writer = Writer::start(&master);
    writer.put(&stored);
    let mut answer = ready(0);
    for attempt in 0..100u64 {
        let req = request(10 + attempt, 6 * B + 1, &ids[..6]);
        answer = client.probe_until(&req, 0, Deadline::Answer).await;
        client.on_finished(req.request_id);
        if answer == ready(6 * B) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(answer, ready(6 * B));
    assert_eq!(client.batch_stats().expect("connected").keys_from_cache, 28);
    client.close();
}

/// A real master killed and restarted empty at the same address: a direct client with
/// the presence cache on never answers "present" from the old master's cache. (Before
/// connection epochs, a fully cached lookup made no call, so it never noticed: every
/// answer after the restart was the old hit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restarted_at_the_same_address_ends_the_presence_cache_mooncake_master() {
    let layout = layout("Qwen/Qwen3-8B", 1);
    let mut master = Master::start();
    let mut writer = Writer::start(&master);
    let ids: Vec<u64> = (1..=6).collect();
    let stored: Vec<String> = ids
        .iter()
        .flat_map(|id| layout.block_keys(&id.to_be_bytes()))
        .collect();
    writer.put(&stored);
    let mut batch = BatchConfig::default();
    batch.presence.enabled = true;
    let mut client =
        LookupClient::connect_lazy(direct(&master, &layout, batch, 1024)).expect("client");
    let mut next_id = 0u64;
    let mut ask = || {
        next_id += 1;
        request(next_id, 6 * B + 1, &ids)
    };
    // Until the answers come from the cache alone (the lease is read first).
    for _ in 0..100 {
        let req = ask();
        assert_eq!(
            client.probe_until(&req, 0, Deadline::Answer).await,
            ready(6 * B)
        );
        client.on_finished(req.request_id);
        if client.batch_stats().expect("connected").keys_from_cache >= 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let calls = client.stats().master.expect("connected").batch_exist_calls;
    let req = ask();
    assert_eq!(
        client.probe_until(&req, 0, Deadline::Answer).await,
        ready(6 * B)
    );
    client.on_finished(req.request_id);
    assert_eq!(
        client.stats().master.expect("connected").batch_exist_calls,
        calls,
        "a fully cached lookup makes no call"
    );

    let port = master.rpc_port();
    drop(writer);
    master.stop();
    let master = Master::start_on(port);
    // Every answer after the restart is unavailable or the new, empty store's miss.
    let mut misses = 0;
    for _ in 0..200 {
        let req = ask();
        assert_eq!(
            client.probe_until(&req, 0, Deadline::Answer).await,
            ready(0)
        );
        match client.answer_of(req.request_id) {
            Some(lookup_core::Answer::Miss) => misses += 1,
            Some(lookup_core::Answer::Unavailable(_)) => {}
            other => panic!("{other:?}"),
        }
        client.on_finished(req.request_id);
        if misses == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(misses, 3, "the restarted master answered");
    drop(master);
    client.close();
}
