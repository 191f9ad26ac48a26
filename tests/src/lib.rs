//! The support library of the end-to-end tests in `tests/tests/` (and of the program
//! tests of `lookup-cli`): compiled once, shared by every test binary.
//!
//! - [`client`]: unique endpoints, a scriptable in-test lookup server, the reference
//!   hit, polling helpers (the client tests);
//! - [`server`]: REQ and DEALER clients written with tmq directly, request frames of
//!   both formats, test indexes that fail, gate or wait (the server tests);
//! - [`direct`]: a scriptable fake Mooncake master (the direct-transport tests);
//! - [`fault`]: the fault workload, its index, a fault-injecting server, the
//!   call-timing harness, a server in a child process, process readers (the fault,
//!   load and server-fuzz tests);
//! - [`fuzz`]: bounded input strategies and reference decoders (the fuzz tests);
//! - [`flood`]: a hostile-input flood of a server over real ZeroMQ (the memory test
//!   of the `lookup-server` program);
//! - [`mooncake`]: a real Mooncake master, etcd and a real Python store client (the
//!   `mooncake-peers` crate, shared with `cargo xtask chaos`);
//! - [`metrics`]: scraping a Prometheus exposition, one raw exchange with a server;
//! - [`logs`]: the log lines a user reads, captured for exact assertions;
//! - [`served`]: the bound ROUTER and serving task every in-test server shares;
//! - [`KilledOnDrop`]: a child process that never outlives its test.
//!
//! Test binaries are grouped by area (`client`, `direct`, `fuzz`, `mooncake`,
//! `server`), one module a former file. A test keeps a binary of its own when it
//! reads process-wide state (a global metrics recorder, a global allocator, this
//! process's descriptors, threads or memory) or holds a caller-time budget under
//! faults (`fault_injection`, `fault_restart`), so that no other area runs beside it.

use std::process::Child;

pub mod client;
pub mod direct;
pub mod fault;
pub mod flood;
pub mod fuzz;
pub mod logs;
pub mod metrics;
pub use mooncake_peers as mooncake;
pub mod served;
pub mod server;

/// A child process killed (and reaped) on drop, so a failing test leaves none behind.
#[derive(Debug)]
pub struct KilledOnDrop(pub Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
