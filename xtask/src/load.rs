//! `cargo xtask load`: many engines against one real Mooncake master, batched and
//! unbatched, presence cache on and off, side by side in one run.
//!
//! Each engine is a `LookupClient` on the direct transport with its own master
//! connection, as separate scheduler processes would have. It runs a closed loop:
//! `--burst` arrivals at once (prefetch), then waits for each answer. Prompts are the
//! first `--prompts` requests of a Mooncake trace at vLLM block size 16 (a 512-token
//! trace block is 32 vLLM blocks), with the leading `--stored-pct` % of each prompt's
//! blocks written to the store by the real Python client beforehand. Reported per
//! mode and engine count: lookups/s, lookup p50/p99 (arrival to answer), master calls
//! and keys per lookup, and the master's CPU per lookup (`/proc/<pid>/stat`, user +
//! system); and per mode the highest lookups/s with p99 ≤ `--p99-ms`.
//!
//! The engines and the master share this machine's cores: on 2 cores the client side's
//! CPU competes with the master's, so the ceilings are this machine's, not a master's.

use lookup_tokio::Deadline;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use lookup_core::{BlockHashes, Probe, Request, RequestId};
use lookup_tokio::mooncake_master::{MasterClient, MasterConfig};
use lookup_tokio::{BatchConfig, ClientConfig, DirectConfig, KeyLayout, LookupClient};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::replay::peers::{self, Master, PutBatch, Writer};
use crate::simulate::trace::{TRACE_BLOCK_TOKENS, TraceRequest, load};

/// `cargo xtask load` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Engine counts to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub engines: Vec<usize>,
    /// Seconds per (mode, engine count) cell.
    #[arg(long, default_value_t = 3.0)]
    pub duration_s: f64,
    /// Arrivals each engine issues at once per turn.
    #[arg(long, default_value_t = 4)]
    pub burst: usize,
    /// Trace whose prompts are used; default the conversation trace in
    /// `../shared/traces/`, else a generated one.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Prompts taken from the trace.
    #[arg(long, default_value_t = 200)]
    pub prompts: usize,
    /// Percent of each prompt's leading blocks stored.
    #[arg(long, default_value_t = 50)]
    pub stored_pct: u32,
    /// vLLM block size, tokens.
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// The latency bound of "sustained", milliseconds (p99).
    #[arg(long, default_value_t = 10.0)]
    pub p99_ms: f64,
    /// Seed of the engines' prompt choice.
    #[arg(long, default_value_t = 11)]
    pub seed: u64,
}

/// One mode of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mode {
    batched: bool,
    cache: bool,
}

impl Mode {
    const ALL: [Self; 4] = [
        Self {
            batched: false,
            cache: false,
        },
        Self {
            batched: true,
            cache: false,
        },
        Self {
            batched: false,
            cache: true,
        },
        Self {
            batched: true,
            cache: true,
        },
    ];

    fn name(self) -> &'static str {
        match (self.batched, self.cache) {
            (false, false) => "unbatched",
            (true, false) => "batched",
            (false, true) => "unbatched+cache",
            (true, true) => "batched+cache",
        }
    }

    fn batch(self) -> BatchConfig {
        let mut batch = if self.batched {
            BatchConfig::default()
        } else {
            BatchConfig::unbatched()
        };
        batch.presence.enabled = self.cache;
        batch
    }
}

/// One cell's figures.
#[derive(Clone, Copy, Debug, Default)]
struct Cell {
    lookups: u64,
    per_s: f64,
    p50_us: u64,
    p99_us: u64,
    calls: u64,
    keys: u64,
    from_cache: u64,
    master_cpu_us: f64,
}

/// A prompt: tokens and vLLM block hashes.
struct Prompt {
    num_tokens: u32,
    hashes: BlockHashes,
}

fn prompts(args: &Args) -> anyhow::Result<(Vec<Prompt>, Vec<String>)> {
    let path = args.trace.clone().unwrap_or_else(|| {
        peers::workspace_root().join("../shared/traces/conversation_trace.jsonl")
    });
    let trace: Vec<TraceRequest> = if path.is_file() {
        load(&path).with_context(|| format!("reading {}", path.display()))?
    } else {
        eprintln!("{} not found: generated prompts", path.display());
        crate::simulate::generator::generate(args.seed, args.prompts)
    };
    let per = u64::from((TRACE_BLOCK_TOKENS / args.block_size.max(1)).max(1));
    let layout = KeyLayout::default();
    let mut stored = std::collections::BTreeSet::new();
    let prompts = trace
        .iter()
        .take(args.prompts)
        .map(|req| {
            let blocks = (u64::from(req.input_length / args.block_size.max(1)))
                .min(req.hash_ids.len() as u64 * per);
            let ids: Vec<u64> = (0..blocks)
                .map(|k| req.hash_ids[(k / per) as usize] * per + k % per)
                .collect();
            let hashes = BlockHashes::from_u64s(&ids);
            let keep = ids.len() * args.stored_pct.min(100) as usize / 100;
            stored.extend(layout.chain_keys(&hashes, keep));
            Prompt {
                num_tokens: req.input_length,
                hashes,
            }
        })
        .collect();
    Ok((prompts, stored.into_iter().collect()))
}

/// Runs the benchmark and prints the table.
///
/// # Errors
/// A missing master or Python client (naming the install script), a trace that
/// cannot be read, a client that cannot connect.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let (prompts, keys) = prompts(args)?;
    let logs = tempfile::tempdir()?;
    let master = Master::start(&peers::default_master_bin(), logs.path())?;
    let writer = Writer::start(&peers::default_python(), &master.addr, logs.path())?;
    let started = Instant::now();
    if let Some(tx) = writer.sender() {
        for chunk in keys.chunks(5_000) {
            let _ = tx.send(PutBatch {
                keys: chunk.to_vec(),
                at: Instant::now(),
            });
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // The writer keeps running (its blocks go when its client closes); the writes are
    // in order, so the last key present means every key is.
    runtime.block_on(async {
        let probe = MasterClient::connect(&master.addr, MasterConfig::default()).await?;
        let deadline = Instant::now() + Duration::from_secs(300);
        let last = keys.last().cloned().unwrap_or_default();
        while !keys.is_empty() && !probe.exist(&last).await.unwrap_or(false) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the writer did not store the blocks within 300 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::Ok(())
    })?;
    let avg_keys = prompts.iter().map(|p| p.hashes.len()).sum::<usize>() / prompts.len().max(1);
    println!(
        "{} prompts ({avg_keys} keys on average at block size {}), {} keys stored in {:.1} s; \
         {} s per cell, bursts of {}",
        prompts.len(),
        args.block_size,
        keys.len(),
        started.elapsed().as_secs_f64(),
        args.duration_s,
        args.burst
    );
    let prompts = Arc::new(prompts);
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        println!(
            "load average at start: {} (on {} cores: a busy machine slows the master and the engines alike)",
            load.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
            std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
        );
    }
    println!(
        "| mode | engines | lookups/s | p50 µs | p99 µs | calls/lookup | keys/lookup | cached keys/lookup | master CPU µs/lookup |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut best = Vec::new();
    for mode in Mode::ALL {
        let mut ceiling: Option<(f64, usize)> = None;
        for &engines in &args.engines {
            let cell = runtime.block_on(cell(&master, mode, engines, &prompts, args))?;
            println!(
                "| {} | {engines} | {:.0} | {} | {} | {:.2} | {:.1} | {:.1} | {:.1} |",
                mode.name(),
                cell.per_s,
                cell.p50_us,
                cell.p99_us,
                cell.calls as f64 / cell.lookups.max(1) as f64,
                cell.keys as f64 / cell.lookups.max(1) as f64,
                cell.from_cache as f64 / cell.lookups.max(1) as f64,
                cell.master_cpu_us
            );
            if cell.p99_us as f64 <= args.p99_ms * 1000.0
                && ceiling.is_none_or(|(per_s, _)| cell.per_s > per_s)
            {
                ceiling = Some((cell.per_s, engines));
            }
        }
        best.push((mode, ceiling));
    }
    drop(writer);
    println!(
        "\n| mode | highest lookups/s with p99 ≤ {} ms | at engines |",
        args.p99_ms
    );
    println!("|---|---:|---:|");
    for (mode, ceiling) in best {
        match ceiling {
            Some((per_s, engines)) => println!("| {} | {per_s:.0} | {engines} |", mode.name()),
            None => println!("| {} | none met the bound | - |", mode.name()),
        }
    }
    Ok(())
}

/// The master's user + system CPU time so far (`/proc/<pid>/stat` fields 14-15).
fn master_cpu(master: &Master) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", master.pid()?)).ok()?;
    // The command name may hold spaces: fields count from after its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on Linux.
    Some(Duration::from_millis(ticks * 10))
}

async fn cell(
    master: &Master,
    mode: Mode,
    engines: usize,
    prompts: &Arc<Vec<Prompt>>,
    args: &Args,
) -> anyhow::Result<Cell> {
    let mut clients = Vec::with_capacity(engines);
    for _ in 0..engines {
        let mut direct =
            DirectConfig::parse(&master.addr, KeyLayout::default()).expect("master address");
        direct.master_config = MasterConfig::default();
        direct.batch = mode.batch();
        let mut config = ClientConfig::new(direct, args.block_size);
        config.core.lookup_async = true;
        config.core.lookup_prefetch_limit = 64;
        config.core.max_in_flight = 64;
        let mut client = LookupClient::connect_lazy(config)?;
        // Connected before the clock starts.
        let warm = Request {
            request_id: RequestId(u64::MAX),
            num_tokens: 1,
            block_hashes: BlockHashes::from_u64s(&[]),
            skip_reading_external_kv: false,
        };
        let _ = client.probe_until(&warm, 0, Deadline::Answer).await;
        client.on_finished(warm.request_id);
        clients.push(client);
    }
    let cpu_before = master_cpu(master);
    let duration = Duration::from_secs_f64(args.duration_s.max(0.1));
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::with_capacity(engines);
    for (e, mut client) in clients.into_iter().enumerate() {
        let prompts = Arc::clone(prompts);
        let burst = args.burst.max(1);
        let seed = args.seed ^ (e as u64) << 32;
        tasks.push(tokio::spawn(async move {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut latency = Histogram::<u64>::new(3).expect("histogram");
            let mut next = 0u64;
            let before = client.stats().master.unwrap_or_default();
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let reqs: Vec<Request> = (0..burst)
                    .map(|_| {
                        let p = &prompts[rng.random_range(0..prompts.len())];
                        next += 1;
                        Request {
                            request_id: RequestId(next),
                            num_tokens: p.num_tokens,
                            block_hashes: p.hashes.clone(),
                            skip_reading_external_kv: false,
                        }
                    })
                    .collect();
                for req in &reqs {
                    client.on_new_request(req);
                }
                for req in &reqs {
                    let answer = client.probe_until(req, 0, Deadline::Answer).await;
                    debug_assert!(matches!(answer, Probe::Ready { .. }));
                    let us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
                    let _ = latency.record(us.max(1));
                    client.on_finished(req.request_id);
                }
            }
            let after = client.stats().master.unwrap_or_default();
            let from_cache = client.batch_stats().map_or(0, |b| b.keys_from_cache);
            client.close();
            (
                latency,
                after.batch_exist_calls - before.batch_exist_calls,
                after.keys_asked - before.keys_asked,
                from_cache,
            )
        }));
    }
    let mut latency = Histogram::<u64>::new(3).expect("histogram");
    let (mut calls, mut keys, mut from_cache) = (0, 0, 0);
    for task in tasks {
        let (h, c, k, f) = task.await.context("an engine task panicked")?;
        latency.add(&h).context("histograms")?;
        calls += c;
        keys += k;
        from_cache += f;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = match (cpu_before, master_cpu(master)) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => Duration::ZERO,
    };
    let lookups = latency.len();
    Ok(Cell {
        lookups,
        per_s: lookups as f64 / elapsed,
        p50_us: latency.value_at_quantile(0.5),
        p99_us: latency.value_at_quantile(0.99),
        calls,
        keys,
        from_cache,
        master_cpu_us: cpu.as_secs_f64() * 1e6 / lookups.max(1) as f64,
    })
}
