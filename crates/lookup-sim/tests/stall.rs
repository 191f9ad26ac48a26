//! A stall is detected and reported in every mode: a trace whose requests keep
//! preempting one another on a GPU of 18 blocks (no local prefix cache, so every
//! restart loads its prefix from the store again) ends with an error naming it,
//! instead of spinning forever (as sync mode did: its blocking probes kept the
//! virtual clock moving, so the deadlock check never fired).

mod common;

use common::req;
use lookup_sim::engine::{SimParams, simulate};
use lookup_sim::mode::Mode;
use lookup_sim::trace::TraceRequest;

/// 22 requests of 795 to 8,431 tokens, some sharing prefixes, 100 to 3,900 ms apart.
fn trace() -> Vec<TraceRequest> {
    vec![
        req(
            43,
            8431,
            370,
            &[
                0, 10000, 10001, 10002, 10003, 10004, 10005, 10006, 10007, 10008, 10009, 10010,
                10011, 10012, 10013, 10014, 10015,
            ],
        ),
        req(
            171,
            7444,
            218,
            &[
                200, 201, 202, 203, 204, 11000, 11001, 11002, 11003, 11004, 11005, 11006, 11007,
                11008, 11009,
            ],
        ),
        req(
            391,
            5570,
            403,
            &[
                12000, 12001, 12002, 12003, 12004, 12005, 12006, 12007, 12008, 12009, 12010,
            ],
        ),
        req(
            648,
            7183,
            275,
            &[
                300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 13000, 13001, 13002, 13003,
            ],
        ),
        req(
            834,
            7982,
            477,
            &[
                0, 14000, 14001, 14002, 14003, 14004, 14005, 14006, 14007, 14008, 14009, 14010,
                14011, 14012, 14013, 14014,
            ],
        ),
        req(
            1050,
            8233,
            539,
            &[
                300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 15000, 15001, 15002, 15003,
                15004, 15005, 15006,
            ],
        ),
        req(1170, 1947, 237, &[100, 101, 102, 103]),
        req(1258, 795, 140, &[17000, 17001]),
        req(
            1521,
            4779,
            574,
            &[200, 201, 202, 203, 204, 205, 206, 207, 18000, 18001],
        ),
        req(1789, 2089, 373, &[300, 301, 302, 19000, 19001]),
        req(
            1974,
            7069,
            457,
            &[
                200, 201, 202, 203, 204, 205, 206, 207, 208, 20000, 20001, 20002, 20003, 20004,
            ],
        ),
        req(2245, 1920, 256, &[300, 301, 302, 21000]),
        req(
            2501,
            4614,
            528,
            &[300, 301, 302, 303, 22000, 22001, 22002, 22003, 22004, 22005],
        ),
        req(
            2737,
            7411,
            360,
            &[
                300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 23000, 23001, 23002, 23003,
            ],
        ),
        req(
            2986,
            5250,
            228,
            &[300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310],
        ),
        req(
            3123,
            8305,
            492,
            &[
                100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 25000, 25001, 25002, 25003,
                25004, 25005, 25006,
            ],
        ),
        req(3282, 3135, 213, &[300, 301, 302, 303, 26000, 26001, 26002]),
        req(
            3320,
            4605,
            350,
            &[200, 201, 202, 203, 204, 205, 206, 207, 27000],
        ),
        req(
            3374,
            6546,
            61,
            &[
                28000, 28001, 28002, 28003, 28004, 28005, 28006, 28007, 28008, 28009, 28010, 28011,
                28012,
            ],
        ),
        req(3513, 5305, 233, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 29000]),
        req(
            3649,
            6190,
            251,
            &[
                100, 30000, 30001, 30002, 30003, 30004, 30005, 30006, 30007, 30008, 30009, 30010,
                30011,
            ],
        ),
        req(
            3865,
            7356,
            33,
            &[
                0, 1, 2, 3, 4, 5, 31000, 31001, 31002, 31003, 31004, 31005, 31006, 31007, 31008,
            ],
        ),
    ]
}

#[test]
fn a_livelock_is_reported_in_every_mode() {
    // The defaults of `cargo xtask simulate` (four engines), with the two flags.
    let mut p = SimParams::default();
    p.engine.gpu_kv_blocks = 18 * 32;
    p.engine.local_prefix_cache = false;
    // Without vLLM 0.33's full-prompt gate (scheduler_reserve_full_isl false, vLLM
    // before PR #37307) each request is admitted on its first chunk, and the engines
    // preempt and re-admit the same requests: the livelock every mode must report.
    p.engine.scheduler_reserve_full_isl = false;
    for mode in Mode::ALL {
        let err = simulate(trace().into_iter().map(Ok), mode, &p, &|_| {})
            .expect_err("18 x 32 blocks cannot hold these requests side by side");
        let msg = format!("{err:#}");
        assert!(
            msg.starts_with(&format!("{mode} mode "))
                && (msg.contains(" stalled at ") || msg.contains(" livelocked (")),
            "{mode}: {msg}"
        );
        if mode == Mode::Sync {
            // Requests whose loads are done keep their blocks (and vLLM's reservation
            // for them) until admitted, first in the queue (`_holds_kv_blocks`,
            // `kv_holding_waiting`): here the head needs a few blocks more than are
            // free while the others hold the rest, and nothing runs: a deadlock.
            assert!(
                msg.contains(" stalled at ") && msg.contains(" and 0 running "),
                "{msg}"
            );
        }
    }
}
