//! `cargo xtask replay`'s library function on 200 requests of the simulator's
//! generated trace (shaped like the conversation trace), against a real
//! `mooncake_master` it starts per run, blocks written by the real Python store client,
//! in the prefetch mode over both transports. The figures are checked for sanity: every
//! request ends, the prefixes that repeat are found in the store, every lookup is
//! answered, and the master's own counters match what the clients and the writer did.
//! Needs `scripts/mooncake/install.sh`.

use std::time::Instant;

use xtask::replay::engine::EngineModel;
use xtask::replay::{ReplayParams, Transport, replay, report};
use xtask::simulate::generator;
use xtask::simulate::mode::Mode;

#[test]
fn replay_of_200_requests_mooncake_master() {
    let trace = generator::generate(7, 200);
    let params = ReplayParams {
        modes: vec![Mode::Prefetch],
        transports: vec![Transport::Zmq, Transport::Direct],
        // Arrivals over 2.4 s (the trace spans 48 s); prefill at a fifteenth of the
        // default cost and attention at a tenth (the trace holds a 110k-token
        // prompt), so that eight engines drain them within a few seconds.
        rate_scale: 20.0,
        engines: 8,
        engine: EngineModel {
            prefill_token_s: 2e-6,
            prefill_pair_s: 1e-10,
            ..EngineModel::default()
        },
        ..ReplayParams::default()
    };
    let started = Instant::now();
    let report = replay(&trace, &params).expect("replay");
    let table = report::table(&report.runs);
    eprintln!("{table}{}", report::ratios(&report.runs));
    eprintln!("replayed in {:?}", started.elapsed());

    assert_eq!(report.requests, 200);
    assert_eq!(report.runs.len(), 2);
    for (run, transport) in report.runs.iter().zip([Transport::Zmq, Transport::Direct]) {
        let label = run.label();
        assert_eq!((run.mode, run.transport), (Mode::Prefetch, transport));
        // Every request ends, each with its first token.
        assert_eq!((run.finished, run.first_tokens), (200, 200), "{label}");
        // Prefixes repeat in the trace: some are found in the store and loaded.
        assert!(run.external_hit_tokens > 0, "{label}: no hit tokens");
        assert!(run.outcomes.hit > 0, "{label}: no lookup hit");
        // Hits are whole vLLM blocks (16 tokens), the block size the clients, the
        // server and the direct transport count in.
        assert_eq!(run.external_hit_tokens % 16, 0, "{label}");
        // Every lookup sent was answered, none failed.
        assert_eq!(
            (
                run.outcomes.failed,
                run.outcomes.timed_out,
                run.outcomes.malformed
            ),
            (0, 0, 0),
            "{label}"
        );
        assert_eq!(
            run.outcomes.hit + run.outcomes.miss,
            run.rpcs_sent,
            "{label}"
        );
        assert_eq!(run.lookup_on_wire_us.count, run.rpcs_sent, "{label}");
        assert!(run.lookup_on_wire_us.p50 > 0.0, "{label}");
        assert!(
            run.lookup_on_wire_us.p50 <= run.lookup_on_wire_us.p99,
            "{label}"
        );
        assert!(
            run.lookup_on_wire_us.p50 <= run.lookup_total_us.p50,
            "{label}"
        );
        // Prefetch: some first probes find the answer ready.
        let ready = run.ready_at_first_probe.expect("first probes");
        assert!(ready > 0.0 && ready <= 1.0, "{label}: {ready}");
        // Blocks were written, and the master saw exactly those puts and lookups.
        assert!(run.keys_written > 0, "{label}");
        assert_eq!(run.put_errors, 0, "{label}");
        let master = |series: &str| {
            run.master
                .get(series)
                .copied()
                .unwrap_or_else(|| panic!("{label}: {series} not scraped"))
        };
        // The writer puts in batches: each key is one PutStart or one batch item.
        assert_eq!(
            master("master_put_start_requests_total")
                + master("master_batch_put_start_items_total"),
            run.keys_written as f64,
            "{label}"
        );
        assert_eq!(
            master("master_key_count"),
            run.keys_written as f64,
            "{label}"
        );
        assert_eq!(
            master("master_batch_exist_key_requests_total"),
            run.batch_exist_calls as f64,
            "{label}"
        );
        assert_eq!(
            master("master_batch_exist_key_failures_total"),
            0.0,
            "{label}"
        );
        assert!(run.ttft_ms.p50 > 0.0 && run.ttft_ms.p50 <= run.ttft_ms.p99);
        assert!(table.contains(&label), "{table}");
    }
    assert!(table.contains("200/200"), "{table}");
}
