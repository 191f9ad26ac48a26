//! `cargo xtask chaos`: real lookup clients against a real Mooncake store that moves,
//! with every answer judged against what the store held.
//!
//! Two worlds on loopback, each with the real peers of `mooncake-peers`: one
//! `mooncake_master` (faults `remove`, `wipe`, `restart`), and an etcd with two HA
//! masters (faults `leader-kill`, `etcd-down`). In each, the Python store client
//! (`mooncake_peers::writer_script`) stores every block of a few prompts, and four clients
//! look the prompts up in a loop ([`load`]): a direct client with its presence cache
//! off and one with it on, and a ZeroMQ client of a `lookup-server --mooncake-master`
//! process with the server's presence cache off and one with it on ([`server`]). The
//! faults come one after the other ([`single`], [`ha`]); each keeps a phase of its own,
//! and the [`truth`] records every put, remove, wipe and loss as it happens.
//!
//! Every answer is then judged ([`report`]): an answer claiming a block the store no
//! longer held, past the bound of how the block left ([`truth::Bounds`]: read lease
//! plus result TTL for a removal behind the client's back, result TTL for a store
//! lost with its master), is wrong; a probe that took longer than `lookup_timeout_s`
//! plus the wait margin (and `--slack-ms`) is over its timeout. The table counts both
//! per fault and client; the command fails when either is not zero, unless
//! `--report-only`.

pub mod ha;
pub mod load;
pub mod report;
pub mod server;
pub mod single;
pub mod truth;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use lookup_tokio::Endpoint;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use load::{Answer, Client, ClientKind, Prompts, Settings, Target};
use truth::{Bounds, Truth};

/// `cargo xtask chaos` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Faults to inject, comma-separated, in this order whatever the order given.
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = Fault::INJECTED)]
    pub faults: Vec<Fault>,
    /// Only the faults of one master (remove, wipe, restart): no etcd, no HA, ~35 s.
    #[arg(long, conflicts_with = "faults")]
    pub quick: bool,
    /// Print the table (and JSON) and exit 0 even when answers are wrong or probes
    /// are over their timeout.
    #[arg(long)]
    pub report_only: bool,
    /// Write the results as JSON to this file (`-` for standard output, after the
    /// table goes to standard error).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// The masters' read lease (`-default_kv_lease_ttl`), milliseconds.
    #[arg(long, default_value_t = 5_000)]
    pub lease_ms: u64,
    /// The clients' result TTL (`lookup_prefetch_ttl_s`), milliseconds; below the lease.
    #[arg(long, default_value_t = 1_000)]
    pub ttl_ms: u64,
    /// The clients' `lookup_timeout_s`, milliseconds.
    #[arg(long, default_value_t = 2_000)]
    pub lookup_timeout_ms: u64,
    /// Added to every bound: the time a fault takes to reach the clients' sockets
    /// and the judge's view of it, milliseconds.
    #[arg(long, default_value_t = 200)]
    pub slack_ms: u64,
    /// Seconds of load before the first fault of each world, and after each refill of
    /// the store (so the next fault finds the caches full).
    #[arg(long, default_value_t = 2.0)]
    pub steady_s: f64,
    /// Seconds each fault's phase lasts after the fault (at least the removal bound,
    /// lease + TTL + slack, to see answers past it).
    #[arg(long, default_value_t = 7.0)]
    pub window_s: f64,
    /// Seconds etcd stays down in `etcd-down`.
    #[arg(long, default_value_t = 10.0)]
    pub etcd_down_s: f64,
    /// Prompts looked up (16 blocks each, all stored).
    #[arg(long, default_value_t = 8)]
    pub prompts: usize,
    /// Pause between two lookups of one client, milliseconds.
    #[arg(long, default_value_t = 5)]
    pub pause_ms: u64,
    /// The `lookup-server` to run (default: built by cargo beside this program).
    #[arg(long, value_name = "PATH")]
    pub server_bin: Option<PathBuf>,
}

/// A phase of a run: the fault injected at its start (or none).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum, serde::Serialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// No fault: load on one master.
    Steady,
    /// The second half of every prompt's blocks removed (forced) by the Python client,
    /// behind the presence caches.
    Remove,
    /// `RemoveAll(force)` by another client of the master.
    Wipe,
    /// The master killed (SIGKILL) and started again, empty, at the same address.
    Restart,
    /// No fault: load on an HA cluster.
    SteadyHa,
    /// The HA leader killed (SIGKILL); the standby takes over, empty.
    LeaderKill,
    /// etcd killed for `--etcd-down-s` and started again on its ports and data.
    EtcdDown,
}

impl Fault {
    /// The faults a default run injects.
    pub const INJECTED: [Self; 5] = [
        Self::Remove,
        Self::Wipe,
        Self::Restart,
        Self::LeaderKill,
        Self::EtcdDown,
    ];

    /// The name in the table and on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Steady => "steady",
            Self::Remove => "remove",
            Self::Wipe => "wipe",
            Self::Restart => "restart",
            Self::SteadyHa => "steady-ha",
            Self::LeaderKill => "leader-kill",
            Self::EtcdDown => "etcd-down",
        }
    }

    fn is_ha(self) -> bool {
        matches!(self, Self::SteadyHa | Self::LeaderKill | Self::EtcdDown)
    }
}

/// A phase: its fault and when it ran, from the run's start.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Phase {
    /// The fault injected at its start.
    pub fault: Fault,
    /// Start.
    pub from: Duration,
    /// End.
    pub until: Duration,
}

/// The record of a run: its clock, the truth, the phases.
#[derive(Debug)]
pub struct Run {
    epoch: Instant,
    /// What the store held over time.
    pub truth: Truth,
    /// The phases so far; the last one is open (its end is moved at each call).
    pub phases: Vec<Phase>,
    /// The prompts and their keys.
    pub prompts: Arc<Prompts>,
    /// The clients' settings.
    pub settings: Settings,
    /// Load before the first fault, and after each put that refills the store.
    pub steady: Duration,
    /// Load after each fault.
    pub window: Duration,
}

impl Run {
    /// Time since the run's start.
    #[must_use]
    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Ends the open phase now and opens one for `fault`.
    pub fn phase(&mut self, fault: Fault) {
        let now = self.now();
        self.end_phase();
        self.phases.push(Phase {
            fault,
            from: now,
            until: now,
        });
    }

    /// Ends the open phase now.
    pub fn end_phase(&mut self) {
        let now = self.now();
        if let Some(last) = self.phases.last_mut() {
            last.until = last.until.max(now);
        }
    }

    /// Puts `keys` with `writer` and records them from the time the put was sent.
    pub fn put(&mut self, writer: &mut mooncake_peers::Writer, keys: &[String]) {
        let at = self.now();
        writer.put(keys);
        self.truth.put(keys, at);
    }
}

/// The four clients of a world, looking the prompts up until stopped.
pub struct Fleet {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<Vec<Answer>>>,
}

impl Fleet {
    /// Connects a direct client with the cache off and on to `master` (and its
    /// cluster id), a ZeroMQ client to each server (`(cache, endpoint)`), and starts
    /// them on `runtime`.
    ///
    /// # Errors
    /// A client cannot connect.
    pub fn start(
        runtime: &Runtime,
        run: &Run,
        master: &str,
        cluster: Option<&str>,
        servers: &[(bool, Endpoint)],
    ) -> anyhow::Result<Self> {
        let _guard = runtime.enter();
        let mut clients = Vec::new();
        for cache in [false, true] {
            let client = Client {
                kind: ClientKind::Direct,
                cache,
            };
            let target = Target::Direct(master.to_owned(), cluster.map(str::to_owned));
            clients.push((client, load::connect(client, &target, &run.settings)?));
        }
        for (cache, endpoint) in servers {
            let client = Client {
                kind: ClientKind::Zmq,
                cache: *cache,
            };
            let target = Target::Zmq(endpoint.clone());
            clients.push((client, load::connect(client, &target, &run.settings)?));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = clients
            .into_iter()
            .enumerate()
            .map(|(i, (client, lookup))| {
                runtime.spawn(load::run_client(
                    lookup,
                    client,
                    Arc::clone(&run.prompts),
                    i,
                    run.settings,
                    run.epoch,
                    Arc::clone(&stop),
                ))
            })
            .collect();
        Ok(Self { stop, tasks })
    }

    /// Stops the clients and returns every answer they recorded.
    ///
    /// # Errors
    /// A client task panicked.
    pub fn stop(self, runtime: &Runtime) -> anyhow::Result<Vec<Answer>> {
        self.stop.store(true, Ordering::Relaxed);
        let mut answers = Vec::new();
        for task in self.tasks {
            answers.extend(runtime.block_on(task).context("a client task panicked")?);
        }
        Ok(answers)
    }
}

/// Sleeps `d` on the calling (orchestrating) thread.
pub fn pause(d: Duration) {
    std::thread::sleep(d);
}

/// Runs the selected faults, prints the table, and fails when an answer was wrong or
/// a probe over its timeout (unless `--report-only`).
///
/// # Errors
/// A missing master, Python client or etcd (naming the install script), a peer that
/// does not start, and, without `--report-only`, wrong answers or probes over their
/// timeout.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let faults: Vec<Fault> = if args.quick {
        vec![Fault::Remove, Fault::Wipe, Fault::Restart]
    } else {
        args.faults.clone()
    };
    mooncake_peers::find_master_bin().map_err(anyhow::Error::msg)?;
    mooncake_peers::find_python_bin().map_err(anyhow::Error::msg)?;
    if faults.iter().any(|f| f.is_ha()) {
        mooncake_peers::ha::find_etcd_bin().map_err(anyhow::Error::msg)?;
    }
    if args.ttl_ms >= args.lease_ms {
        bail!("--ttl-ms must be below --lease-ms: a result kept past the lease is unbacked");
    }
    let server_bin = match &args.server_bin {
        Some(path) => path.clone(),
        None => server::build()?,
    };
    let logs = tempfile::tempdir()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let settings = Settings {
        lease: Duration::from_millis(args.lease_ms),
        ttl: Duration::from_millis(args.ttl_ms),
        lookup_timeout: Duration::from_millis(args.lookup_timeout_ms),
        wait_margin: Duration::from_millis(100),
        pause: Duration::from_millis(args.pause_ms),
    };
    let mut run = Run {
        epoch: Instant::now(),
        truth: Truth::new(),
        phases: Vec::new(),
        prompts: Arc::new(Prompts::new(
            args.prompts.max(1),
            &lookup_tokio::KeyLayout::default(),
        )),
        settings,
        steady: Duration::from_secs_f64(args.steady_s.max(0.0)),
        window: Duration::from_secs_f64(args.window_s.max(0.0)),
    };
    let mut answers = Vec::new();
    let has = |f: Fault| faults.contains(&f);
    if has(Fault::Remove) || has(Fault::Wipe) || has(Fault::Restart) {
        answers.extend(single::run(
            &runtime,
            &mut run,
            &faults,
            &server_bin,
            logs.path(),
        )?);
    }
    if has(Fault::LeaderKill) || has(Fault::EtcdDown) {
        let down = Duration::from_secs_f64(args.etcd_down_s.max(0.0));
        answers.extend(ha::run(
            &runtime,
            &mut run,
            &faults,
            down,
            &server_bin,
            logs.path(),
        )?);
    }
    let slack = Duration::from_millis(args.slack_ms);
    let bounds = Bounds::new(settings.lease, settings.ttl, slack);
    let limit = settings.probe_limit() + slack;
    let rows = report::rows(&run, &answers, &bounds, limit);
    let table = report::table(&rows, &bounds, limit);
    let to_stdout = args.json.as_deref().is_some_and(|p| p.as_os_str() == "-");
    if to_stdout {
        eprint!("{table}");
    } else {
        print!("{table}");
    }
    if let Some(path) = &args.json {
        let json = report::json(&rows, &run, &bounds, limit)?;
        if to_stdout {
            println!("{json}");
        } else {
            std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    let over: u64 = rows.iter().map(|r| r.over_timeout).sum();
    if (wrong > 0 || over > 0) && !args.report_only {
        bail!("{wrong} wrong answers and {over} probes over their timeout (expected 0 and 0)");
    }
    Ok(())
}
