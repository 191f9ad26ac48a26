//! Project tasks, reached as `cargo xtask <task>` (an alias of `cargo run --release
//! --package xtask --`). Each task is one module; `main.rs` only dispatches.
//!
//! - [`bench`](mod@bench): the lookup channel's performance next to a bare ZeroMQ
//!   loop and the Python design of vLLM's async lookup.
//! - [`calibrate`]: what a lookup costs through each real server on this machine, as
//!   the calibration file `simulate` reads.
//! - [`chaos`]: real lookup clients against a real Mooncake store that moves (master
//!   restart, wipe, removals, HA leader kill, etcd down), every answer judged against
//!   what the store held.
//! - [`fidelity`]: `replay` and `simulate` on the same slice, side by side, with the
//!   agreement targets.
//! - [`load`]: 1 to 64 engines against one real Mooncake master, batched and
//!   unbatched, presence cache on and off: master calls, keys and CPU per lookup,
//!   latency, and the highest lookups/s within a p99 bound.
//! - [`presence`]: how many master keys the lease-backed presence cache saves, on
//!   the traces and on a generated workload with shared system prompts.
//! - [`replay`]: a slice of a Mooncake trace in real time against a real Mooncake
//!   master, through the real lookup client over ZeroMQ or directly to the master.
//! - [`simulate`]: replay a Mooncake trace through a model of a vLLM-like engine and
//!   compare the lookup modes.
//! - [`test`](mod@test): install the real test peers and run every test (the
//!   README's test command).

pub mod bench;
pub mod calibrate;
pub mod chaos;
pub mod fidelity;
pub mod load;
pub mod presence;
pub mod replay;
pub mod simulate;
pub mod test;
