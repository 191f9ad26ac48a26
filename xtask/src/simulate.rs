//! `cargo xtask simulate`: the flags ([`Args`]) and the launch ([`run`]) of the
//! trace-replay simulator, which lives in the `lookup-sim` crate. Its modules are
//! re-exported here, so the other tasks (`fidelity`, `replay`, `calibrate`, `load`,
//! `presence`) reach the trace reader, the modes and the cost model as before.

pub use lookup_sim::*;
