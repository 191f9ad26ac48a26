//! Model-based property test of [`lookup_core::Lookups`] and [`lookup_core::Dispatcher`]
//! against a reference model of `spec/behaviour.md` rules 1-17 (STYLE.md rule 14).
//!
//! Each case picks a configuration and drives up to 60 random inputs: arrivals,
//! probes (same prompt, grown prompt, another chain at the same length, various local
//! hits), allocation, preemption, finish, reset, close, clock jumps and timeouts, and
//! a fake server that answers the RPCs on the wire in any order, late, twice, after
//! their request was discarded, with right, too high, unaligned or undecodable values,
//! or fails them. After every step the harness checks the core against the model:
//! exact probe answers, events, RPC ids on the wire, prefetch slots, open RPCs, the
//! next deadline and the counters.
//!
//! Layout: `model/reference.rs` (the model), `model/sut.rs` (the harness),
//! `model/transitions.rs`, `model/strategies.rs`, `model/server.rs` (fake server),
//! `model/scenarios.rs` (minimal failing sequences found, replayed as named tests).

#[path = "model/reference.rs"]
mod reference;
#[path = "model/scenarios.rs"]
mod scenarios;
#[path = "model/server.rs"]
mod server;
#[path = "model/strategies.rs"]
mod strategies;
#[path = "model/sut.rs"]
mod sut;
#[path = "model/transitions.rs"]
mod transitions;

use proptest::prelude::ProptestConfig;
use proptest::test_runner::{FileFailurePersistence, RngSeed};
use proptest_state_machine::prop_state_machine;
use sut::LookupTest;

/// 4,000 cases from a fixed seed (about 6 s in a debug build on 2 cores), so that
/// every run checks the same sequences. `PROPTEST_CASES` and `PROPTEST_RNG_SEED`
/// override them for longer or different soaks; failures are kept in
/// `proptest-regressions/model.txt` and replayed first.
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
