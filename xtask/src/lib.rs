//! Project tasks, reached as `cargo xtask <task>` (an alias of `cargo run --release
//! --package xtask --`). Each task is one module; `main.rs` only dispatches.
//!
//! - [`simulate`]: replay a Mooncake trace through a model of a vLLM-like engine and
//!   compare the lookup modes.
//! - [`test`]: install the real test peers and run every test (the README's test
//!   command).

pub mod simulate;
pub mod test;
