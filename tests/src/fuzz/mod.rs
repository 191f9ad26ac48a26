//! Shared pieces of the `fuzz_*` tests (RELIABILITY.md): input strategies that mix
//! arbitrary bytes with mutated valid messages of both wire formats, all bounded in
//! size, and reference decoders written from `spec/wire.md` alone (not from
//! `lookup_core::wire`), so the fuzz tests assert exact results, not just "no panic".

mod reference;
mod strategies;

use proptest::test_runner::{Config, RngSeed};

pub use reference::*;
pub use strategies::*;

/// Seed of every fuzz run unless `PROPTEST_RNG_SEED` names another (CONTRIBUTING.md rule 13:
/// tests are seeded; a failure prints the seed it needs).
pub const SEED: u64 = 0x1f2e_3d4c_5b6a_7988;

/// Longest arbitrary-bytes frame the strategies produce (bytes); structured frames
/// stay within a few kilobytes. Inputs stay small, so a case costs microseconds and an
/// allocation proportional to a length claim, rather than to the bytes, would show.
pub const MAX_FRAME: usize = 320;

/// A proptest configuration of `cases` cases, seeded with [`SEED`] unless the
/// environment gives a seed.
pub fn config(cases: u32) -> Config {
    let base = Config::default();
    let rng_seed = match base.rng_seed {
        RngSeed::Random => RngSeed::Fixed(SEED),
        fixed => fixed,
    };
    Config {
        cases,
        rng_seed,
        // The seed reproduces a failure; the failing input is printed whole.
        failure_persistence: None,
        ..base
    }
}
