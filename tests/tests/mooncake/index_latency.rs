//! Latency of one lookup through the whole server path: a REQ client (vLLM's socket)
//! → `LookupServer` on ipc → `MooncakeIndex` → the real master, next to the master
//! call alone (our client's leading-run query on the same keys) and the same server
//! answering from its in-memory index. Every block is stored, so every key is asked
//! about (one `BatchExistKey` call: at most 1,024 keys).
//!
//! A measurement, not a test: ignored by default, asserts the answers, nothing about
//! time.
//! `cargo test --release -p lookup-tests --test mooncake -- index_latency --ignored --nocapture`

use std::sync::Arc;
use std::time::Instant;

use lookup_core::BlockHashes;
use lookup_core::wire::Format;
use lookup_server::{
    Endpoint, InMemoryIndex, KeyLayout, LookupServer, MooncakeIndex, RankNamespace, ServerConfig,
};
use lookup_tests::mooncake::{Master, Writer};
use lookup_tests::server::{Req, hit, lookup};
use lookup_tokio::mooncake_master::MasterConfig;
use tempfile::TempDir;

const REPS: usize = 1000;
const WARMUP: usize = 100;
const B: u32 = 16;
const TB: Format = Format::TaggedBlob;

/// p50 and p99 of nanosecond samples, in microseconds.
fn percentiles(mut ns: Vec<u128>) -> (f64, f64) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0;
    (at(0.50), at(0.99))
}

/// `REPS` timed lookups of `ids` (after `WARMUP`), each expected to hit `expected`.
async fn time_lookups(req: &mut Req, ids: &[u64], expected: u32) -> Vec<u128> {
    let num_tokens = u32::try_from(ids.len()).unwrap() * B + 1;
    let frames = lookup(TB, num_tokens, B, ids);
    let mut samples = Vec::with_capacity(REPS);
    for rep in 0..WARMUP + REPS {
        let started = Instant::now();
        let reply = req.call(&frames).await;
        let took = started.elapsed().as_nanos();
        assert_eq!(hit(TB, &reply), expected);
        if rep >= WARMUP {
            samples.push(took);
        }
    }
    samples
}

#[tokio::test]
#[ignore = "measurement: run with --ignored --nocapture"]
async fn mooncake_master_lookup_latency_through_the_server() {
    let master = Master::start();
    let mut writer = Writer::start(&master);
    let index = Arc::new(
        MooncakeIndex::connect(&master.addr(), MasterConfig::default())
            .await
            .unwrap(),
    );
    let ctx = tmq::Context::new();
    println!(
        "| blocks | namespaces | keys | master call p50/p99 µs | server+master p50/p99 µs | server+memory p50/p99 µs |"
    );
    println!("|---|---|---|---|---|---|");
    for (salt, blocks) in [16u64, 64, 256].into_iter().enumerate() {
        for namespaces in [1u32, 4] {
            let layout = KeyLayout::new("Qwen/Qwen3-8B")
                .with_namespaces(RankNamespace::grid(namespaces, 1))
                .unwrap();
            let ids: Vec<u64> = (0..blocks)
                .map(|i| (salt as u64) << 40 | u64::from(namespaces) << 32 | i)
                .collect();
            let keys = layout.chain_keys(&BlockHashes::from_u64s(&ids), ids.len());
            writer.put(&keys);
            let expected = u32::try_from(blocks).unwrap() * B;

            let mut direct = Vec::with_capacity(REPS);
            for rep in 0..WARMUP + REPS {
                let started = Instant::now();
                let run = index
                    .master()
                    .leading_blocks_flat(&keys, namespaces as usize)
                    .await
                    .unwrap();
                let took = started.elapsed().as_nanos();
                assert_eq!(run, ids.len());
                if rep >= WARMUP {
                    direct.push(took);
                }
            }

            let dir = TempDir::new().unwrap();
            let server = LookupServer::bind(
                &Endpoint::Ipc(dir.path().join("mooncake.sock")),
                ServerConfig::new(B, layout.clone()),
                index.clone(),
            )
            .unwrap();
            let mut req = Req::connect(&ctx, server.local_endpoint());
            let through_master = time_lookups(&mut req, &ids, expected).await;
            server.shutdown().await;

            let memory = Arc::new(InMemoryIndex::new());
            memory.insert_chain(&layout, &BlockHashes::from_u64s(&ids), ids.len());
            let server = LookupServer::bind(
                &Endpoint::Ipc(dir.path().join("memory.sock")),
                ServerConfig::new(B, layout.clone()),
                memory,
            )
            .unwrap();
            let mut req = Req::connect(&ctx, server.local_endpoint());
            let through_memory = time_lookups(&mut req, &ids, expected).await;
            server.shutdown().await;

            let (d50, d99) = percentiles(direct);
            let (m50, m99) = percentiles(through_master);
            let (i50, i99) = percentiles(through_memory);
            println!(
                "| {blocks} | {namespaces} | {} | {d50:.0} / {d99:.0} | {m50:.0} / {m99:.0} | {i50:.0} / {i99:.0} |",
                keys.len()
            );
        }
    }
    let stats = index.stats();
    assert_eq!(stats.errors, 0);
    assert_eq!(stats.master.connects, 1);
}
