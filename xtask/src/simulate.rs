//! `cargo xtask simulate`: the trace-replay simulator, which lives in the `lookup-sim`
//! crate with its flags ([`Args`]) and launch ([`run`]); this module re-exports it. Its modules are
//! re-exported here, so the other tasks (`fidelity`, `replay`, `calibrate`, `load`,
//! `presence`) reach the trace reader, the modes and the cost model as before.

pub use lookup_sim::*;
