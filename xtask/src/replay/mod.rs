//! `cargo xtask replay`: a slice of a Mooncake trace in real time, against a real
//! Mooncake master, through the real [`LookupClient`](lookup_tokio::LookupClient) in a lookup mode and over a
//! transport, with lookup latency measured rather than modelled.
//!
//! For each (mode, transport) run, one after another:
//!
//! 1. a fresh `mooncake_master` on free loopback ports (or the one given with
//!    `--master`), and the Python store client (`mooncake_peers::writer_script`) that
//!    writes blocks, under a model name of the run's own, so runs never see each
//!    other's blocks;
//! 2. the transport: `zmq`, our [`LookupServer`](lookup_server::LookupServer) with a [`MooncakeIndex`](lookup_server::MooncakeIndex) on that
//!    master, in this process, over ipc; or `direct`, each client asking the master
//!    itself ([`Transport::Direct`](lookup_tokio::Transport::Direct));
//! 3. `--engines` real-time engine models ([`engine`]) with the simulator's GPU KV
//!    cache, prefix cache and preemption (`gpu`), one [`LookupClient`](lookup_tokio::LookupClient) each
//!    (the mode's configuration is the simulator's, [`Mode::config`](crate::simulate::mode::Mode::config)), requests routed
//!    round robin, arrivals at the trace's timestamps divided by `--rate-scale`;
//! 4. when a request's prefill ends its blocks are put into Mooncake for real (one key
//!    per block and rank namespace, the layout's key format), so later requests with
//!    the same prefix hit;
//! 5. the table: TTFT, readiness at first probe, lookup latency from the clients'
//!    events (`on_wire`: send to answer; `total`: submission to answer), and the
//!    master's own counters scraped from its metrics port.

pub mod engine;
mod gpu;
mod model;
mod params;
pub mod peers;
pub mod report;
mod run;

use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

pub use self::params::{Args, MasterSource, ReplayParams};
use self::report::RunSummary;
pub use self::run::replay;
use crate::simulate::generator;
use crate::simulate::trace;

/// How the replay's clients reach the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// Our `LookupServer` (with `MooncakeIndex`) in this process, over ZeroMQ ipc: the
    /// vLLM path (scheduler → worker → master).
    Zmq,
    /// Each client asks the master itself (scheduler → master).
    Direct,
}

impl Transport {
    /// The name on the command line and in reports.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Zmq => "zmq",
            Self::Direct => "direct",
        }
    }
}

/// What a replay measured: one summary per run, in the order run.
#[derive(Debug, Serialize)]
pub struct ReplayReport {
    /// Requests replayed per run.
    pub requests: usize,
    /// Arrival rate multiplier.
    pub rate_scale: f64,
    /// Engines.
    pub engines: u32,
    /// One per (mode, transport), in the order run.
    pub runs: Vec<RunSummary>,
}

/// `cargo xtask replay`: loads (or generates) the trace, runs every mode over every
/// transport, prints the table and the direct/zmq latency ratios.
///
/// # Errors
/// A bad flag, an unreadable or malformed trace (naming the line), or a failing run
/// (see [`replay`]); a JSON file that cannot be written.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let params = args.params()?;
    let (mut requests, source) = match &args.trace {
        Some(path) => (trace::load(path)?, path.display().to_string()),
        None => (
            generator::generate(args.seed, args.limit),
            format!("generated (conversation-trace shape, seed {})", args.seed),
        ),
    };
    requests.truncate(args.limit);
    let span_s = requests
        .last()
        .zip(requests.first())
        .map_or(0.0, |(l, f)| (l.timestamp - f.timestamp) as f64 / 1e3);
    println!(
        "trace: {source}, {} requests over {:.0} s, rate scale {} (arrivals over {:.0} s)",
        requests.len(),
        span_s,
        params.rate_scale,
        span_s / params.rate_scale
    );
    println!(
        "{} engines: budget {} tokens, {} seqs, step {:.1} ms + {:.0} µs/prefill token; \
         outputs capped at {}; clients: max_in_flight {}, prefetch limit {}, TTL {} s, timeout {} s; \
         {} rank namespace(s)",
        params.engines,
        params.engine.max_num_batched_tokens,
        params.engine.max_num_seqs,
        params.engine.step_fixed_s * 1e3,
        params.engine.prefill_token_s * 1e6,
        params.engine.max_output_tokens,
        params.max_in_flight,
        params.lookup.prefetch_limit,
        params.lookup.prefetch_ttl_s,
        params.lookup.timeout_s,
        params.tp_size,
    );
    let started = Instant::now();
    let report = replay(&requests, &params)?;
    println!();
    print!("{}", report::table(&report.runs));
    println!();
    print!("{}", report::ratios(&report.runs));
    println!(
        "replayed {} requests x {} runs in {:.1} s of wall time",
        requests.len(),
        report.runs.len(),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).context("encoding JSON")?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        println!("JSON: {}", path.display());
    }
    Ok(())
}
