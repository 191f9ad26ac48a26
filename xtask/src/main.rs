//! Project tasks, reached as `cargo xtask <task>`. Each subcommand lives in its own
//! module of the `xtask` library; this file only parses and dispatches.

use clap::{Parser, Subcommand};

/// Project tasks.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "Project tasks", version)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Replay a Mooncake trace through a model of a vLLM-like engine and compare the
    /// lookup modes sync, async, prefetch, prefetch+ and prefetch+wait (TTFT, queue wait,
    /// RPCs).
    #[command(allow_negative_numbers = true)]
    Simulate(Box<xtask::simulate::Args>),
    /// Measure the lookup channel: caller cost per probe and lookups per second, ours
    /// next to a bare tmq REQ/REP loop and the Python design of vLLM's async lookup.
    Bench(Box<xtask::bench::Args>),
    /// Replay a slice of a Mooncake trace in real time against a real Mooncake master,
    /// through the real lookup client over ZeroMQ (our server) or directly to the
    /// master; lookup latency measured.
    Replay(Box<xtask::replay::Args>),
    /// Measure the fixed, per-call and per-key costs (present and absent keys) of the
    /// real Mooncake master, our lookup-server (in-memory and Mooncake-backed) and a
    /// Python server that builds keys like vLLM's worker; write a calibration file.
    Calibrate(Box<xtask::calibrate::Args>),
    /// Run `replay` and `simulate` on the same trace slice with comparable settings and
    /// print them side by side, with the agreement targets.
    Fidelity(Box<xtask::fidelity::Args>),
    /// Load one real Mooncake master with 1 to 64 engines (direct clients), batched and
    /// unbatched, presence cache on and off, side by side: calls, keys and master CPU
    /// per lookup, p50/p99, the highest lookups/s with p99 within a bound.
    Load(Box<xtask::load::Args>),
    /// Count the master keys the lease-backed presence cache saves, on both traces and
    /// on a generated workload with shared system prompts (offline, deterministic).
    Presence(Box<xtask::presence::Args>),
    /// Run real lookup clients (direct, with and without the presence cache, and
    /// ZeroMQ through lookup-server) against a real Mooncake store while it moves
    /// (removals, a wipe, a master restart, an HA leader kill, etcd down), and count
    /// the answers that claim blocks the store no longer held and the probes over
    /// their timeout; non-zero exit when either is found.
    Chaos(Box<xtask::chaos::Args>),
    /// Install the real test peers (Mooncake master, pyzmq) and run every test.
    Test(xtask::test::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Simulate(mut args) => {
            // The plot goes under the checkout this runs in, not the one that built it.
            if args.plot.is_none() {
                let root = mooncake_peers::workspace_root();
                args.plot = Some(root.join("target/simulate/ttft_cdf.png"));
            }
            xtask::simulate::run(&args)
        }
        Task::Bench(args) => xtask::bench::run(&args),
        Task::Replay(args) => xtask::replay::run(&args),
        Task::Calibrate(args) => xtask::calibrate::run(&args),
        Task::Fidelity(args) => xtask::fidelity::run(&args),
        Task::Load(args) => xtask::load::run(&args),
        Task::Presence(args) => xtask::presence::run(&args),
        Task::Chaos(args) => xtask::chaos::run(&args),
        Task::Test(args) => xtask::test::run_tests(&args),
    }
}
