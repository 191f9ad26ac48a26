//! The cost of following the leader when nothing fails: one leading-run lookup
//! against the same real HA leader through a fixed `host:port` and through
//! `etcd://`, interleaved call by call so that both see the same machine. Every key
//! is stored, so each lookup asks about all of them (one call: at most 1,024 keys).
//!
//! A measurement, not a test: ignored by default, asserts the answers, nothing about
//! time.
//! `cargo test --release -p lookup-tests --test mooncake_ha_latency -- --ignored --nocapture`

use std::time::Instant;

use lookup_tests::mooncake::Writer;
use lookup_tests::mooncake::ha::HaCluster;
use mooncake_master::{MasterClient, MasterConfig};

const REPS: usize = 2000;
const WARMUP: usize = 200;

/// p50 and p99 of nanosecond samples, in microseconds.
fn percentiles(mut ns: Vec<u128>) -> (f64, f64) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0;
    (at(0.50), at(0.99))
}

#[test]
#[ignore = "measurement: run with --ignored --nocapture"]
fn mooncake_ha_latency_fixed_address_vs_etcd() {
    let cluster = HaCluster::start(false);
    let mut writer = Writer::start_at(
        &cluster.addr(),
        &[("MC_STORE_CLUSTER_ID", cluster.cluster_id.as_str())],
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut config = MasterConfig::default();
    config.cluster_id = Some(cluster.cluster_id.clone());
    let (fixed, ha) = rt.block_on(async {
        let fixed = MasterClient::connect(cluster.masters[0].addr(), config.clone());
        let ha = MasterClient::connect(cluster.addr(), config);
        (fixed.await.unwrap(), ha.await.unwrap())
    });
    assert_eq!(
        ha.leader().unwrap().leader.to_string(),
        cluster.masters[0].addr()
    );
    println!("| keys | fixed p50 µs | fixed p99 µs | etcd:// p50 µs | etcd:// p99 µs |");
    println!("|---|---|---|---|---|");
    for keys in [24usize, 256, 1024] {
        let keys: Vec<String> = (0..keys).map(|i| format!("ha-lat-{keys}-{i}")).collect();
        writer.put(&keys);
        let (mut a, mut b) = (Vec::with_capacity(REPS), Vec::with_capacity(REPS));
        rt.block_on(async {
            for rep in 0..WARMUP + REPS {
                for (client, out) in [(&fixed, &mut a), (&ha, &mut b)] {
                    let started = Instant::now();
                    let run = client.leading_run(&keys).await.unwrap();
                    let took = started.elapsed().as_nanos();
                    assert_eq!(run, keys.len());
                    if rep >= WARMUP {
                        out.push(took);
                    }
                }
            }
        });
        let ((a50, a99), (b50, b99)) = (percentiles(a), percentiles(b));
        println!(
            "| {} | {a50:.0} | {a99:.0} | {b50:.0} | {b99:.0} |",
            keys.len()
        );
    }
    let stats = ha.stats();
    println!(
        "etcd:// client: {} view reads, {} leader changes, {} failed fast",
        stats.view_reads, stats.leader_changes, stats.failed_fast
    );
    assert_eq!((stats.leader_changes, stats.failed_fast), (0, 0));
}
