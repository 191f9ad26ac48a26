//! Latency of one leading-run lookup against the real master: our client vs the
//! Python client's `batch_is_exist`, same keys, same master, same run. Every block is
//! stored, so both ask about every key (one call each: at most 1,024 keys).
//!
//! A measurement, not a test: ignored by default, asserts nothing about time.
//! `cargo test -p lookup-tests --test mooncake -- master_latency --ignored --nocapture`

use std::time::Instant;

use lookup_tests::mooncake::{Master, Writer};
use mooncake_master::key::{KeyFormat, RankNamespace};
use mooncake_master::{MasterClient, MasterConfig};

const REPS: usize = 1000;
const WARMUP: usize = 100;

/// p50 and p99 of nanosecond samples, in microseconds.
fn percentiles(mut ns: Vec<i64>) -> (f64, f64) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0;
    (at(0.50), at(0.99))
}

#[tokio::test]
#[ignore = "measurement: run with --ignored --nocapture"]
async fn mooncake_master_latency_ours_vs_python_batch_is_exist() {
    let master = Master::start();
    let mut writer = Writer::start(&master);
    let client = MasterClient::connect(master.addr(), MasterConfig::default())
        .await
        .unwrap();
    println!(
        "| blocks | namespaces | keys | ours p50 µs | ours p99 µs | python p50 µs | python p99 µs |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (salt, blocks) in [16usize, 64, 256].into_iter().enumerate() {
        for namespaces in [1u32, 4] {
            let ns: Vec<RankNamespace> = (0..namespaces).map(RankNamespace::tp).collect();
            let format = KeyFormat::new(None, "Qwen/Qwen3-8B", &ns);
            let keys: Vec<String> = (0..blocks as u64)
                .flat_map(|i| {
                    format.block_keys(
                        &((salt as u64) << 40 | u64::from(namespaces) << 32 | i).to_be_bytes(),
                    )
                })
                .collect();
            writer.put(&keys);
            let per_block = namespaces as usize;
            let mut ours = Vec::with_capacity(REPS);
            for rep in 0..WARMUP + REPS {
                let started = Instant::now();
                let run = client.leading_blocks_flat(&keys, per_block).await.unwrap();
                let took = started.elapsed().as_nanos() as i64;
                assert_eq!(run, blocks);
                if rep >= WARMUP {
                    ours.push(took);
                }
            }
            let python = writer.bench(WARMUP + REPS, &keys)[WARMUP..].to_vec();
            let (o50, o99) = percentiles(ours);
            let (p50, p99) = percentiles(python);
            println!(
                "| {blocks} | {namespaces} | {} | {o50:.0} | {o99:.0} | {p50:.0} | {p99:.0} |",
                keys.len()
            );
        }
    }
}
