//! `cargo xtask load`: many engines against one real Mooncake master, batched and
//! unbatched, presence cache on and off, side by side in one run.
//!
//! Two paths to the master (`--paths`): `direct`, where each engine is a
//! `LookupClient` on the direct transport with its own master connection, batcher and
//! presence cache, as separate scheduler processes would have; and `server`, where the
//! engines are ZeroMQ clients of one `LookupServer` whose Mooncake index batches and
//! caches for all of them. Each engine runs a closed loop:
//! `--burst` arrivals at once (prefetch), then waits for each answer. Prompts are the
//! first `--prompts` requests of a Mooncake trace at vLLM block size 16 (a 512-token
//! trace block is 32 vLLM blocks), with the leading `--stored-pct` % of each prompt's
//! blocks written to the store by the real Python client beforehand. Reported per
//! mode and engine count: lookups/s, lookup p50/p99 (arrival to answer), master calls
//! and keys per lookup, and the master's CPU per lookup (`/proc/<pid>/stat`, user +
//! system); and per mode the highest lookups/s with p99 ≤ `--p99-ms`.
//!
//! A cell measures a steady state: its engines first run the same loop for
//! `--warmup-s` seconds, uncounted, so a presence cache holds what a running engine's
//! would (a cache is only as old as its connection, and a cell's clients are new);
//! `--warmup-s 0` measures the cold start instead.
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
use lookup_server::{LookupServer, MooncakeIndex, ServerConfig};
use lookup_tokio::mooncake_master::{MasterClient, MasterConfig};
use lookup_tokio::{BatchConfig, ClientConfig, DirectConfig, Endpoint, KeyLayout, LookupClient};
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
    /// Paths to the master, comma-separated: `direct` (each engine its own master
    /// client) and `server` (one lookup server for all engines).
    #[arg(long, value_delimiter = ',', default_value = "direct,server")]
    pub paths: Vec<Path>,
    /// Seconds per (mode, engine count) cell, measured after the warm-up.
    #[arg(long, default_value_t = 3.0)]
    pub duration_s: f64,
    /// Seconds each cell's engines run before its measured window (their presence
    /// caches fill as a running engine's would; 0: measure the cold start).
    #[arg(long, default_value_t = 8.0)]
    pub warmup_s: f64,
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

/// Where an engine's lookups go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Path {
    /// Each engine asks the master itself (the direct transport), with its own
    /// connection, batcher and presence cache.
    Direct,
    /// Each engine asks one `LookupServer` over ZeroMQ; the server's Mooncake index
    /// asks the master, batching and caching across the engines.
    Server,
}

impl Path {
    const fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Server => "server",
        }
    }
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

    /// The defaults: batched, presence cache on.
    const DEFAULT: Self = Self {
        batched: true,
        cache: true,
    };

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
         {} s per cell after a {} s warm-up, bursts of {}",
        prompts.len(),
        args.block_size,
        keys.len(),
        started.elapsed().as_secs_f64(),
        args.duration_s,
        args.warmup_s,
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
        "| path | mode | engines | lookups/s | p50 µs | p99 µs | calls/lookup | keys/lookup | cached keys/lookup | master CPU µs/lookup |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut best = Vec::new();
    // Master CPU per lookup of (path, mode, engines), for the ratios below.
    let mut cpu = Vec::new();
    for &path in &args.paths {
        for mode in Mode::ALL {
            let mut ceiling: Option<(f64, usize)> = None;
            for &engines in &args.engines {
                let cell = runtime.block_on(cell(&master, path, mode, engines, &prompts, args))?;
                println!(
                    "| {} | {} | {engines} | {:.0} | {} | {} | {:.2} | {:.1} | {:.1} | {:.1} |",
                    path.name(),
                    mode.name(),
                    cell.per_s,
                    cell.p50_us,
                    cell.p99_us,
                    cell.calls as f64 / cell.lookups.max(1) as f64,
                    cell.keys as f64 / cell.lookups.max(1) as f64,
                    cell.from_cache as f64 / cell.lookups.max(1) as f64,
                    cell.master_cpu_us
                );
                cpu.push((path, mode, engines, cell.master_cpu_us));
                if cell.p99_us as f64 <= args.p99_ms * 1000.0
                    && ceiling.is_none_or(|(per_s, _)| cell.per_s > per_s)
                {
                    ceiling = Some((cell.per_s, engines));
                }
            }
            best.push((path, mode, ceiling));
        }
    }
    drop(writer);
    println!(
        "\n| path | mode | highest lookups/s with p99 ≤ {} ms | at engines |",
        args.p99_ms
    );
    println!("|---|---|---:|---:|");
    for (path, mode, ceiling) in best {
        match ceiling {
            Some((per_s, engines)) => {
                println!(
                    "| {} | {} | {per_s:.0} | {engines} |",
                    path.name(),
                    mode.name()
                );
            }
            None => println!(
                "| {} | {} | none met the bound | - |",
                path.name(),
                mode.name()
            ),
        }
    }
    println!("\nmaster CPU per lookup, the defaults (batched+cache) over unbatched and uncached:");
    let of = |path, mode, engines| {
        cpu.iter()
            .find(|&&(p, m, e, _)| p == path && m == mode && e == engines)
            .map(|&(.., us)| us)
    };
    for &path in &args.paths {
        for &engines in &args.engines {
            if let (Some(default), Some(base)) = (
                of(path, Mode::DEFAULT, engines),
                of(path, Mode::ALL[0], engines),
            ) {
                println!(
                    "  {} at {engines} engine(s): {default:.1} / {base:.1} µs = {:.2}",
                    path.name(),
                    default / base.max(f64::MIN_POSITIVE)
                );
            }
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

/// The `server` path's lookup server and its index, kept alive for a cell.
struct Shared {
    _server: LookupServer,
    index: Arc<MooncakeIndex>,
    _dir: tempfile::TempDir,
}

impl Shared {
    /// Master calls, keys asked and keys answered from the presence cache so far, for
    /// every engine's lookups.
    fn counts(&self) -> (u64, u64, u64) {
        let stats = self.index.stats();
        (
            stats.master.batch_exist_calls,
            stats.master.keys_asked,
            stats.batch.keys_from_cache,
        )
    }
}

/// A cell's engines, connected, and the server they share on the `server` path.
async fn engines(
    master: &Master,
    path: Path,
    mode: Mode,
    engines: usize,
    args: &Args,
) -> anyhow::Result<(Vec<LookupClient>, Option<Shared>)> {
    let mut core = lookup_core::Config::new(args.block_size);
    core.lookup_async = true;
    core.lookup_prefetch_limit = 64;
    core.max_in_flight = 64;
    let mut server = None;
    let mut configs = Vec::with_capacity(engines);
    match path {
        Path::Direct => {
            for _ in 0..engines {
                let mut direct = DirectConfig::parse(&master.addr, KeyLayout::default())
                    .context("master address")?;
                direct.master_config = MasterConfig::default();
                direct.batch = mode.batch();
                let mut config = ClientConfig::new(direct, args.block_size);
                config.core = core.clone();
                configs.push(config);
            }
        }
        Path::Server => {
            let index = Arc::new(
                MooncakeIndex::connect(&master.addr, MasterConfig::default())
                    .await
                    .with_context(|| format!("connecting the index to {}", master.addr))?
                    .with_batching(mode.batch())?,
            );
            let dir = tempfile::tempdir()?;
            let bound = LookupServer::bind(
                &Endpoint::Ipc(dir.path().join("lookup.sock")),
                ServerConfig::new(args.block_size, KeyLayout::default()),
                index.clone(),
            )
            .context("binding the lookup server")?;
            for _ in 0..engines {
                let mut config = ClientConfig::zmq(bound.local_endpoint().clone(), args.block_size);
                config.core = core.clone();
                configs.push(config);
            }
            server = Some(Shared {
                _server: bound,
                index,
                _dir: dir,
            });
        }
    }
    let mut clients = Vec::with_capacity(engines);
    for config in configs {
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
    Ok((clients, server))
}

/// What one engine counted in the measured window.
struct EngineWindow {
    latency: Histogram<u64>,
    calls: u64,
    keys: u64,
    from_cache: u64,
}

/// One engine's closed loop: warms up until `measure_from`, then records each lookup
/// started before `deadline`.
async fn engine_loop(
    mut client: LookupClient,
    prompts: Arc<Vec<Prompt>>,
    burst: usize,
    seed: u64,
    measure_from: Instant,
    deadline: Instant,
) -> EngineWindow {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut latency = Histogram::<u64>::new(3).expect("histogram");
    let mut next = 0u64;
    let counts = |client: &mut LookupClient| {
        let master = client.stats().master.unwrap_or_default();
        let from_cache = client.batch_stats().map_or(0, |b| b.keys_from_cache);
        (master.batch_exist_calls, master.keys_asked, from_cache)
    };
    let mut before = None;
    loop {
        let t0 = Instant::now();
        if t0 >= deadline {
            break;
        }
        let measured = t0 >= measure_from;
        if measured && before.is_none() {
            before = Some(counts(&mut client));
        }
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
            if measured {
                let us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
                let _ = latency.record(us.max(1));
            }
            client.on_finished(req.request_id);
        }
    }
    let after = counts(&mut client);
    let before = before.unwrap_or(after);
    client.close();
    EngineWindow {
        latency,
        calls: after.0 - before.0,
        keys: after.1 - before.1,
        from_cache: after.2 - before.2,
    }
}

async fn cell(
    master: &Master,
    path: Path,
    mode: Mode,
    engines: usize,
    prompts: &Arc<Vec<Prompt>>,
    args: &Args,
) -> anyhow::Result<Cell> {
    let (clients, shared) = self::engines(master, path, mode, engines, args).await?;
    let started = Instant::now();
    let measure_from = started + Duration::from_secs_f64(args.warmup_s.max(0.0));
    let deadline = measure_from + Duration::from_secs_f64(args.duration_s.max(0.1));
    let mut tasks = Vec::with_capacity(engines);
    for (e, client) in clients.into_iter().enumerate() {
        let seed = args.seed ^ (e as u64) << 32;
        tasks.push(tokio::spawn(engine_loop(
            client,
            Arc::clone(prompts),
            args.burst.max(1),
            seed,
            measure_from,
            deadline,
        )));
    }
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu_before = master_cpu(master);
    let server_before = shared.as_ref().map(Shared::counts);
    let mut latency = Histogram::<u64>::new(3).expect("histogram");
    let (mut calls, mut keys, mut from_cache) = (0, 0, 0);
    for task in tasks {
        let w = task.await.context("an engine task panicked")?;
        latency.add(&w.latency).context("histograms")?;
        calls += w.calls;
        keys += w.keys;
        from_cache += w.from_cache;
    }
    let elapsed = measure_from.elapsed().as_secs_f64();
    let cpu = match (cpu_before, master_cpu(master)) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => Duration::ZERO,
    };
    // On the `server` path the engines' own clients ask no master: the index counts.
    if let (Some(b), Some(a)) = (server_before, shared.as_ref().map(Shared::counts)) {
        (calls, keys, from_cache) = (a.0 - b.0, a.1 - b.1, a.2 - b.2);
    }
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
