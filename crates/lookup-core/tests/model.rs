//! Model-based property test of [`lookup_core::Lookups`] and [`lookup_core::Dispatcher`]
//! against a reference model of `spec/behaviour.md` rules 1-17 (CONTRIBUTING.md rule 14).
//!
//! Each case picks a configuration and drives up to 60 random inputs. What is
//! generated:
//!
//! - Configurations: lookup on or off, async or sync, `load_async`, sharing and
//!   priority on or off; prefetch limits 0-16 and `max_in_flight` 1-16; `max_queued`
//!   1, 2 or 65,536; TTLs from 0 (and 1 ns) up to 1e6 s, 1e19 s and `f64::MAX`,
//!   timeouts from 1e-10 s (0 ns: an RPC fails as it is released) up to the same huge
//!   values (deadlines saturate 30 years ahead; nothing panics); block sizes 1, 16 and
//!   512 with block hashes of 1, 8 or 32 bytes; a pool of 6 or 16 requests; a driver
//!   that writes each released RPC at once or only when told; each
//!   `lookup_on_preemption` (rule 8) with a preempted wait of 0, 50 ms or 5 s.
//! - Prompts: lengths around block boundaries (0 to 5 blocks and 0, 1, half a block or
//!   a block less one token more), four chains, as many hashes as full blocks or up to
//!   two fewer or more, rarely none, rarely `skip_reading_external_kv`; identical
//!   prompts across requests (rule 16).
//! - Lifecycle inputs: arrivals; `on_new_request` again for a live request (twice, or
//!   after its allocation); probes of the same prompt, a grown or shrunk one, another
//!   chain at the same length, with a local hit of whole blocks up to the rule 12 cap,
//!   not block-aligned, or above the cap (up to `u32::MAX`); probes of a request that
//!   never arrived; allocation, preemption and finish of any request (known or not);
//!   reset; close.
//! - The clock: jumps of 1 ms to 1e6 s, and to the next deadline (`poll_timeout`),
//!   30 years ahead included.
//! - The driver and the wire: writes of released RPCs, failed writes
//!   (`handle_send_failed` with `Transport` or `NotSent`), a reply for a released RPC
//!   before its write; a fake server that answers the RPCs on the wire in any order,
//!   late, twice, after their request was discarded, with right, too high, unaligned or
//!   undecodable values, or fails or loses them; replies for dead or never-created
//!   ids; reopens; connections that drop without the driver seeing it (what was
//!   written is lost) and connections replaced because the server behind the address
//!   was (a fresh store; a reset may be kept for the new connection).
//!
//! After every step the harness checks the core against the model exactly: probe
//! answers, events, the RPCs written and not yet written, prefetch slots, open RPCs,
//! waiting and tracked requests, each request's first-probe mark and last answer
//! (`answer_of`) and wait budget (`wait_budget`), the next deadline, and every counter of `Stats` and
//! `DispatcherStats`. Beside the model, `model/watch.rs` checks two properties from
//! what the driver and the server saw: no lookup submitted after a reset is answered
//! from the store before the server served that reset (the store is versioned by the
//! resets it served), and no RPC outlives its timeout.
//!
//! Layout: the model is `model/reference.rs` (the lifecycle's state and RPC
//! bookkeeping), `model/probe.rs` (arrivals and probes), `model/dispatcher.rs`
//! (the wire half), `model/machine.rs` (transitions applied), `model/settings.rs`
//! (configuration, clock) and `model/counters.rs`; `model/sut.rs` is the harness,
//! `model/transitions.rs` and `model/strategies.rs` what is generated,
//! `model/server.rs` the fake server and the prompts, `model/scenarios.rs` minimal
//! sequences (found failing, or too rare to trust to chance) replayed as named tests,
//! and `model/moving.rs` those of a moving store and connection (reset barrier, retry
//! backoff across a prompt change, dropped and replaced connections).

#[path = "model/counters.rs"]
mod counters;
#[path = "model/dispatcher.rs"]
mod dispatcher;
#[path = "model/machine.rs"]
mod machine;
#[path = "model/moving.rs"]
mod moving;
#[path = "model/preempt.rs"]
mod preempt;
#[path = "model/probe.rs"]
mod probe;
#[path = "model/reference.rs"]
mod reference;
#[path = "model/scenarios.rs"]
mod scenarios;
#[path = "model/server.rs"]
mod server;
#[path = "model/settings.rs"]
mod settings;
#[path = "model/strategies.rs"]
mod strategies;
#[path = "model/sut.rs"]
mod sut;
#[path = "model/transitions.rs"]
mod transitions;
#[path = "model/watch.rs"]
mod watch;

use proptest::prelude::ProptestConfig;
use proptest::test_runner::{FileFailurePersistence, RngAlgorithm, RngSeed};
use proptest_state_machine::prop_state_machine;
use sut::LookupTest;

/// 4,000 cases from a fixed seed, so that every run checks the same sequences, drawn
/// with proptest's XorShift generator (ChaCha, its default, took half the run time
/// in a debug build). `PROPTEST_CASES`, `PROPTEST_RNG_SEED` and
/// `PROPTEST_RNG_ALGORITHM` override them for longer or different soaks; failures are
/// kept in `proptest-regressions/model.txt` and replayed first.
fn config() -> ProptestConfig {
    let from_env = ProptestConfig::default();
    let set = |key: &str| std::env::var_os(key).is_some();
    ProptestConfig {
        cases: if set("PROPTEST_CASES") {
            from_env.cases
        } else {
            4_000
        },
        rng_seed: if set("PROPTEST_RNG_SEED") {
            from_env.rng_seed
        } else {
            RngSeed::Fixed(0x6c6f_6f6b_7570)
        },
        rng_algorithm: if set("PROPTEST_RNG_ALGORITHM") {
            from_env.rng_algorithm
        } else {
            RngAlgorithm::XorShift
        },
        max_shrink_iters: 20_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/model.txt",
        ))),
        ..from_env
    }
}

prop_state_machine! {
    #![proptest_config(config())]

    /// Random lifecycles against the reference model.
    #[test]
    fn lookups_follow_the_reference_model(sequential 1..60 => LookupTest);
}
