//! `cargo xtask bench --step`: what one scheduler step pays for its lookups, from
//! Rust, against a floor measured in the same loop.
//!
//! A loop shaped like vLLM 0.33's scheduler step calls the client as the connector's
//! hooks do: the step's arrivals (`on_new_request`, which prefetches), one probe per
//! waiting request in queue order (`get_num_new_matched_tokens`; a pending request is
//! skipped and stays), the first `--step-admit` ready ones allocated
//! (`update_state_after_alloc`), and the requests admitted `--step-run` steps ago
//! finished (`request_finished`); then the step waits `--step-us` (the forward pass)
//! while the I/O task works. The lookup time of a step is the clock from its first
//! arrival to its last finish.
//!
//! The floor, timed in the same step right after: one read per waiting request of a
//! `std::collections::HashMap<u64, u64>` holding the waiting requests (the least a
//! step that looks at every waiting request spends on them).
//!
//! Two workloads per queue length: `steady` keeps `queue` requests waiting (as many
//! arrive per step as are admitted); `burst` starts empty, `queue` requests arrive
//! in one step, and the steps until the queue drains are measured. Two paths: the
//! client's own methods, one call each (`per-call`), and one [`Step`] per step
//! (`step`: one clock read, one pass over the I/O task's reports, one hand-over of
//! new RPCs).

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use lookup_core::Probe;
use lookup_tokio::{ClientConfig, Endpoint, LookupClient, Request, Step};
use serde::Serialize;

use super::payload::Payload;
use super::stats::percentile;

/// The step figure's goal: a step's lookup time at 1,024 waiting requests at most
/// this many floors (p50).
pub const FLOOR_GOAL: f64 = 5.0;

/// How the step loop runs (`cargo xtask bench --step` flags).
#[derive(Clone, Debug, Serialize)]
pub struct StepSettings {
    /// Waiting requests (steady) or arrivals at once (burst).
    pub queues: Vec<usize>,
    /// Measured steps per steady run.
    pub steps: usize,
    /// Unmeasured steps before them (prefetches answered, caches warm).
    pub warmup_steps: usize,
    /// Requests admitted per step (and, in a steady run, arriving per step).
    pub admit: usize,
    /// Steps an admitted request runs before it finishes.
    pub run: usize,
    /// The forward pass between two steps (µs).
    pub step_us: u64,
    /// Arrival-time lookups in flight at most (`lookup_prefetch_limit`).
    pub prefetch_limit: u32,
    /// Lookup RPCs on the wire at once (`max_in_flight`).
    pub max_in_flight: u32,
    /// Repetitions of every run; the table shows medians of their percentiles.
    pub reps: usize,
}

/// Which workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// `queue` requests waiting at every step.
    Steady,
    /// `queue` arrivals in one step, then the steps until they are all admitted.
    Burst,
}

/// Which calls a step makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Path {
    /// [`LookupClient`]'s own methods, one call each.
    PerCall,
    /// One [`Step`] per step.
    Step,
}

/// One run's figures: every measured step's lookup time and floor (ns).
#[derive(Clone, Debug, Default, Serialize)]
pub struct StepRun {
    /// Lookup time of each measured step (ns).
    pub lookup_ns: Vec<u64>,
    /// Floor of each measured step (ns).
    pub floor_ns: Vec<u64>,
    /// Waiting requests at each measured step.
    pub waiting: Vec<usize>,
    /// Probes per state over the measured steps: pending, ready.
    pub pending: u64,
    /// Probes that answered `Ready` over the measured steps.
    pub ready: u64,
}

impl StepRun {
    /// The largest `lookup / floor` over the steps.
    fn max_ratio(&self) -> f64 {
        self.lookup_ns
            .iter()
            .zip(&self.floor_ns)
            .map(|(&l, &f)| ratio(l, f))
            .fold(0.0, f64::max)
    }
}

#[allow(clippy::cast_precision_loss)]
fn ratio(a: u64, b: u64) -> f64 {
    a as f64 / b.max(1) as f64
}

/// A scheduler's view of one request.
struct Waiting {
    req: Request,
}

/// The client configuration of every run: async lookups with prefetch at arrival.
fn config(endpoint: &Endpoint, payload: &Payload, s: &StepSettings) -> ClientConfig {
    let mut config = ClientConfig::zmq(endpoint.clone(), payload.block_size);
    config.core.lookup_async = true;
    config.core.lookup_prefetch_limit = s.prefetch_limit;
    config.core.max_in_flight = s.max_in_flight;
    // Every request carries the same prompt: sharing (rule 16) would answer most
    // lookups without an RPC of their own.
    config.core.lookup_share = false;
    config
}

/// The calls of one step, through either path.
enum Calls<'a> {
    PerCall(&'a mut LookupClient),
    Step(Step<'a>),
}

impl Calls<'_> {
    fn arrive(&mut self, req: &Request) {
        match self {
            Self::PerCall(c) => c.on_new_request(req),
            Self::Step(s) => s.on_new_request(req),
        }
    }
    fn probe(&mut self, req: &Request) -> Probe {
        match self {
            Self::PerCall(c) => c.probe(req, 0),
            Self::Step(s) => s.probe(req, 0),
        }
    }
    fn allocated(&mut self, req: &Request) {
        match self {
            Self::PerCall(c) => c.on_allocated(req.request_id),
            Self::Step(s) => s.on_allocated(req.request_id),
        }
    }
    fn finished(&mut self, req: &Request) {
        match self {
            Self::PerCall(c) => c.on_finished(req.request_id),
            Self::Step(s) => s.on_finished(req.request_id),
        }
    }
}

/// The scheduler loop's state across steps.
struct Loop<'p> {
    payload: &'p Payload,
    waiting: VecDeque<Waiting>,
    /// Admitted requests with the step they finish at.
    running: VecDeque<(usize, Request)>,
    /// The floor's map: every waiting request's id.
    map: HashMap<u64, u64>,
    next_id: u64,
    step: usize,
    wrong: u64,
}

/// What one step measured.
struct StepFigures {
    lookup_ns: u64,
    floor_ns: u64,
    waiting: usize,
    pending: u64,
    ready: u64,
}

impl Loop<'_> {
    /// One step: `arrivals` new requests, a probe of every waiting one, up to `admit`
    /// ready ones allocated, finishes due; then the floor.
    fn step(
        &mut self,
        client: &mut LookupClient,
        path: Path,
        arrivals: usize,
        s: &StepSettings,
    ) -> StepFigures {
        let expected = Probe::Ready {
            external_tokens: self.payload.hit_tokens,
            load_async: true,
        };
        let start = Instant::now();
        let mut calls = match path {
            Path::PerCall => Calls::PerCall(client),
            Path::Step => Calls::Step(client.step()),
        };
        for _ in 0..arrivals {
            self.next_id += 1;
            let req = self.payload.request(self.next_id);
            calls.arrive(&req);
            self.map.insert(self.next_id, self.next_id);
            self.waiting.push_back(Waiting { req });
        }
        let (mut pending, mut ready, mut admitted) = (0, 0, 0);
        let mut i = 0;
        while i < self.waiting.len() {
            let probe = calls.probe(&self.waiting[i].req);
            if probe == Probe::Pending {
                pending += 1;
                i += 1;
                continue;
            }
            ready += 1;
            if probe != expected {
                self.wrong += 1;
            }
            if admitted < s.admit {
                admitted += 1;
                let w = self.waiting.remove(i).expect("index in range");
                calls.allocated(&w.req);
                self.map.remove(&w.req.request_id.0);
                self.running.push_back((self.step + s.run, w.req));
            } else {
                i += 1;
            }
        }
        while self.running.front().is_some_and(|(at, _)| *at <= self.step) {
            let (_, req) = self.running.pop_front().expect("front checked");
            calls.finished(&req);
        }
        drop(calls);
        let lookup_ns = nanos(start.elapsed());

        let start = Instant::now();
        let mut sum = 0_u64;
        for w in &self.waiting {
            sum = sum.wrapping_add(*self.map.get(&w.req.request_id.0).unwrap_or(&0));
        }
        black_box(sum);
        let floor_ns = nanos(start.elapsed());
        self.step += 1;
        StepFigures {
            lookup_ns,
            floor_ns,
            waiting: self.waiting.len(),
            pending,
            ready,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One run of `workload` at `queue` through `path`, on a client whose I/O task runs
/// on a one-worker runtime of its own (the caller's thread is the scheduler's, as in
/// the Python drop-in).
///
/// # Errors
/// When the client cannot connect, an answer is wrong, or a burst does not drain.
pub fn run(
    endpoint: &Endpoint,
    payload: &Payload,
    s: &StepSettings,
    workload: Workload,
    path: Path,
    queue: usize,
) -> anyhow::Result<StepRun> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot build a tokio runtime")?;
    let mut client =
        LookupClient::connect_lazy_with_handle(config(endpoint, payload, s), runtime.handle())?;
    let mut l = Loop {
        payload,
        waiting: VecDeque::new(),
        running: VecDeque::new(),
        map: HashMap::new(),
        next_id: 0,
        step: 0,
        wrong: 0,
    };
    let pause = Duration::from_micros(s.step_us);
    let mut out = StepRun::default();
    let keep = |f: StepFigures, out: &mut StepRun| {
        out.lookup_ns.push(f.lookup_ns);
        out.floor_ns.push(f.floor_ns);
        out.waiting.push(f.waiting);
        out.pending += f.pending;
        out.ready += f.ready;
    };
    match workload {
        Workload::Steady => {
            // The queue fills in the first step; warm-up steps answer its lookups,
            // until a step finds no more pending requests than arrive in two.
            let _ = l.step(&mut client, path, queue, s);
            std::thread::sleep(pause);
            let mut warm = 0;
            loop {
                let f = l.step(&mut client, path, s.admit, s);
                std::thread::sleep(pause);
                warm += 1;
                if warm >= s.warmup_steps && f.pending <= 2 * s.admit as u64 {
                    break;
                }
                ensure!(
                    warm < 20_000,
                    "{queue} waiting requests never got their answers"
                );
            }
            for _ in 0..s.steps {
                keep(l.step(&mut client, path, s.admit, s), &mut out);
                std::thread::sleep(pause);
            }
        }
        Workload::Burst => {
            // A warm client (connection up, tables grown once) before the burst.
            let _ = l.step(&mut client, path, s.admit, s);
            for _ in 0..s.warmup_steps {
                let _ = l.step(&mut client, path, 0, s);
                std::thread::sleep(pause);
            }
            ensure!(l.waiting.is_empty(), "the warm-up left requests waiting");
            let limit = 100 * queue.div_ceil(s.admit.max(1)) + 1_000;
            keep(l.step(&mut client, path, queue, s), &mut out);
            std::thread::sleep(pause);
            while !l.waiting.is_empty() {
                ensure!(
                    out.lookup_ns.len() < limit,
                    "a burst of {queue} did not drain in {limit} steps"
                );
                keep(l.step(&mut client, path, 0, s), &mut out);
                std::thread::sleep(pause);
            }
        }
    }
    ensure!(l.wrong == 0, "{} probes answered another hit", l.wrong);
    runtime.block_on(client.shutdown());
    Ok(out)
}

/// The medians over repetitions of one (workload, path, queue) cell.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    /// The workload.
    pub workload: Workload,
    /// The path.
    pub path: Path,
    /// Waiting requests (steady) or burst size.
    pub queue: usize,
    /// Lookup time per step, p50 (ns).
    pub p50_ns: u64,
    /// Lookup time per step, p99 (ns).
    pub p99_ns: u64,
    /// Lookup time per step, max (ns).
    pub max_ns: u64,
    /// Floor per step, p50 (ns).
    pub floor_p50_ns: u64,
    /// Lookup p50 over floor p50.
    pub floor_ratio_p50: f64,
    /// The largest per-step lookup/floor ratio.
    pub floor_ratio_max: f64,
    /// Share of pending answers among the probes.
    pub pending_share: f64,
    /// Every repetition's run.
    pub runs: Vec<StepRun>,
}

impl Cell {
    /// The medians of `runs`.
    #[must_use]
    pub fn of(workload: Workload, path: Path, queue: usize, runs: Vec<StepRun>) -> Self {
        let med = |f: &dyn Fn(&StepRun) -> u64| {
            let v: Vec<u64> = runs.iter().map(f).collect();
            super::stats::median_u64(&v).unwrap_or(0)
        };
        let pct = |v: &[u64], q: f64| {
            let mut v = v.to_vec();
            v.sort_unstable();
            percentile(&v, q).unwrap_or(0)
        };
        let p50_ns = med(&|r| pct(&r.lookup_ns, 0.5));
        let floor_p50_ns = med(&|r| pct(&r.floor_ns, 0.5));
        let maxes: Vec<f64> = runs.iter().map(StepRun::max_ratio).collect();
        let (pending, ready) = runs
            .iter()
            .fold((0, 0), |(p, r), x| (p + x.pending, r + x.ready));
        Self {
            workload,
            path,
            queue,
            p50_ns,
            p99_ns: med(&|r| pct(&r.lookup_ns, 0.99)),
            max_ns: med(&|r| pct(&r.lookup_ns, 1.0)),
            floor_p50_ns,
            floor_ratio_p50: ratio(p50_ns, floor_p50_ns),
            floor_ratio_max: super::stats::median(&maxes).unwrap_or(f64::NAN),
            pending_share: ratio(pending, pending + ready),
            runs,
        }
    }
}

/// Every cell of a `--step` run.
#[derive(Clone, Debug, Serialize)]
pub struct StepReport {
    /// The settings in force.
    pub settings: StepSettings,
    /// Mean existence call of the slow index (s).
    pub index_mean_s: Option<f64>,
    /// Every cell.
    pub cells: Vec<Cell>,
}

impl StepReport {
    /// The table: one row per cell, then the goal's verdict (1,024 waiting, step path).
    #[must_use]
    pub fn table(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "Lookup time per scheduler step (Rust, {} reps; index {:.3} ms per call; floor: one std HashMap read per waiting request)",
            self.settings.reps,
            self.index_mean_s.unwrap_or(f64::NAN) * 1e3
        );
        let _ = writeln!(
            t,
            "{:<7} {:<9} {:>6} {:>10} {:>10} {:>10} {:>10} {:>7} {:>7} {:>8}",
            "load",
            "path",
            "queue",
            "p50 µs",
            "p99 µs",
            "max µs",
            "floor µs",
            "x floor",
            "max x",
            "pending"
        );
        for c in &self.cells {
            #[allow(clippy::cast_precision_loss)]
            let us = |ns: u64| ns as f64 / 1e3;
            let _ = writeln!(
                t,
                "{:<7} {:<9} {:>6} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>7.2} {:>7.2} {:>7.0}%",
                match c.workload {
                    Workload::Steady => "steady",
                    Workload::Burst => "burst",
                },
                match c.path {
                    Path::PerCall => "per-call",
                    Path::Step => "step",
                },
                c.queue,
                us(c.p50_ns),
                us(c.p99_ns),
                us(c.max_ns),
                us(c.floor_p50_ns),
                c.floor_ratio_p50,
                c.floor_ratio_max,
                c.pending_share * 100.0
            );
        }
        for c in self
            .cells
            .iter()
            .filter(|c| c.queue == 1024 && c.workload == Workload::Steady)
        {
            let _ = writeln!(
                t,
                "goal: steady, 1,024 waiting, {:?}: p50 {:.2}x the floor (goal <= {FLOOR_GOAL}x): {}",
                c.path,
                c.floor_ratio_p50,
                if c.floor_ratio_p50 <= FLOOR_GOAL {
                    "met"
                } else {
                    "NOT met"
                }
            );
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_takes_medians_of_percentiles_and_the_worst_step() {
        let run = |lookup: &[u64], floor: &[u64]| StepRun {
            lookup_ns: lookup.to_vec(),
            floor_ns: floor.to_vec(),
            waiting: vec![4; lookup.len()],
            pending: 1,
            ready: 3,
        };
        let cell = Cell::of(
            Workload::Steady,
            Path::Step,
            4,
            vec![
                run(&[10, 20, 30], &[5, 5, 5]),
                run(&[40, 50, 600], &[10, 10, 100]),
                run(&[70, 80, 90], &[10, 10, 10]),
            ],
        );
        assert_eq!((cell.p50_ns, cell.p99_ns, cell.max_ns), (50, 90, 90));
        assert_eq!(cell.floor_p50_ns, 10);
        assert!((cell.floor_ratio_p50 - 5.0).abs() < 1e-9);
        // Worst steps 6, 6 and 9 floors: the median is 6.
        assert!((cell.floor_ratio_max - 6.0).abs() < 1e-9);
        assert!((cell.pending_share - 0.25).abs() < 1e-9);
    }
}
