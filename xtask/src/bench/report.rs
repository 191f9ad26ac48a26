//! The benchmark's results: collected per repetition, reduced to medians, compared
//! with the goals, printed as a table and written as JSON.

use std::fmt::Write as _;

use serde::Serialize;

use super::growth::{self, GrowthCost, Limit};
use super::ours::{Placement, ProbeCosts};
use super::stats::{CallCost, Goal, Summary, median_u64, paired_ratio, ratio};
use super::{DelayKind, Section};

/// The settings of one invocation (after `--quick`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Settings {
    /// Repetitions of every measurement.
    pub reps: usize,
    /// Lookups per throughput run against the in-memory index.
    pub count: usize,
    /// Lookups per throughput run against the slow index.
    pub slow_count: usize,
    /// Requests per caller-cost run.
    pub probe_count: usize,
    /// Caller-cost loop: new requests per step.
    pub arrivals_per_step: usize,
    /// Caller-cost loop: wait between steps (µs).
    pub step_us: u64,
    /// Requests arriving together in the async throughput rows.
    pub batch: usize,
    /// Unmeasured lookups per run (the slow rows use at most 20).
    pub warmup: usize,
    /// Slow index latency per call (ms).
    pub index_ms: f64,
    /// How the slow index waits.
    pub delay: DelayKind,
    /// Block hashes per lookup.
    pub blocks: usize,
    /// Bytes per block hash.
    pub hash_len: usize,
    /// Block size (tokens).
    pub block_size: u32,
    /// Requests tracked at the end of each growth run.
    pub growth_requests: usize,
    /// Whether the Python design's rows run.
    pub python: bool,
    /// The sections that run.
    pub sections: Vec<Section>,
}

/// A throughput row: lookups per second of one loop against one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Row {
    /// Bare tmq REQ client against a bare tmq REP server: the reference.
    Bare,
    /// Bare tmq REQ client against our `LookupServer`: the server's share.
    BareReqOurServer,
    /// Our client (sync, N=1) against the bare REP server: the client's share.
    OursSyncBareRep,
    /// Our client, sync `probe_until(Answer)`, N=1, caller and actor on one thread.
    OursSync,
    /// Our client, sync `probe_until_blocking(Answer)`, N=1, caller and actor on two threads.
    OursSyncTwoThreads,
    /// Our client, async prefetch of a batch then `probe_until(Answer)`, N=1.
    OursBatch1,
    /// As [`Row::OursBatch1`] with N=4.
    OursBatch4,
    /// The Python design, batch submitted then waited for.
    PythonBatch,
    /// [`Row::OursSync`] against the slow index.
    SlowOursSync,
    /// [`Row::OursBatch1`] against the slow index.
    SlowOursBatch1,
    /// [`Row::OursBatch4`] against the slow index.
    SlowOursBatch4,
    /// [`Row::PythonBatch`] against the slow index.
    SlowPythonBatch,
}

impl Row {
    /// Every row, in the order they run and print.
    pub const ALL: [Self; 12] = [
        Self::Bare,
        Self::BareReqOurServer,
        Self::OursSyncBareRep,
        Self::OursSync,
        Self::OursSyncTwoThreads,
        Self::OursBatch1,
        Self::OursBatch4,
        Self::PythonBatch,
        Self::SlowOursSync,
        Self::SlowOursBatch1,
        Self::SlowOursBatch4,
        Self::SlowPythonBatch,
    ];

    /// How the table names the row.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Self::Bare => "bare tmq REQ -> bare tmq REP (reference)",
            Self::BareReqOurServer => "  split: bare tmq REQ -> our LookupServer",
            Self::OursSyncBareRep => "  split: ours N=1 sync -> bare tmq REP",
            Self::OursSync | Self::SlowOursSync => "ours N=1 sync, one thread",
            Self::OursSyncTwoThreads => "ours N=1 sync blocking, two threads",
            Self::OursBatch1 | Self::SlowOursBatch1 => {
                "ours N=1 async: prefetch batch, probe_until"
            }
            Self::OursBatch4 | Self::SlowOursBatch4 => {
                "ours N=4 async: prefetch batch, probe_until"
            }
            Self::PythonBatch | Self::SlowPythonBatch => "Python design: submit batch, wait each",
        }
    }

    /// True for the rows against the slow index.
    #[must_use]
    pub const fn is_slow(self) -> bool {
        matches!(
            self,
            Self::SlowOursSync
                | Self::SlowOursBatch1
                | Self::SlowOursBatch4
                | Self::SlowPythonBatch
        )
    }

    /// True for the Python design's rows.
    #[must_use]
    pub const fn is_python(self) -> bool {
        matches!(self, Self::PythonBatch | Self::SlowPythonBatch)
    }

    /// True for our client's rows (compared with the Python design).
    #[must_use]
    pub const fn is_ours(self) -> bool {
        matches!(
            self,
            Self::OursSync
                | Self::OursSyncTwoThreads
                | Self::OursBatch1
                | Self::OursBatch4
                | Self::SlowOursSync
                | Self::SlowOursBatch1
                | Self::SlowOursBatch4
        )
    }
}

/// Results as they come in, one entry per repetition.
#[derive(Debug)]
pub struct Report {
    settings: Settings,
    python_version: Option<String>,
    ours_probe: Vec<(Placement, ProbeCosts)>,
    python_probe: Vec<ProbeCosts>,
    growth: Vec<GrowthCost>,
    throughput: Vec<(Row, f64)>,
    load_at_start: Option<[f64; 3]>,
    /// Measured mean time of one slow-index call (seconds).
    pub slow_index_mean_s: Option<f64>,
}

/// The system's load averages over 1, 5 and 15 minutes (`/proc/loadavg`), to judge
/// how much else ran on the machine; `None` where the file is missing or unreadable.
#[must_use]
pub fn load_average() -> Option<[f64; 3]> {
    parse_load_average(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

/// The first three fields of a `/proc/loadavg` line.
#[must_use]
pub fn parse_load_average(line: &str) -> Option<[f64; 3]> {
    let mut fields = line.split_whitespace().map(str::parse::<f64>);
    Some([
        fields.next()?.ok()?,
        fields.next()?.ok()?,
        fields.next()?.ok()?,
    ])
}

impl Report {
    /// An empty report of a run with `settings`; `python_version` is pyzmq's, when the
    /// Python rows run.
    #[must_use]
    pub fn new(settings: Settings, python_version: Option<String>) -> Self {
        Self {
            settings,
            python_version,
            ours_probe: Vec::new(),
            python_probe: Vec::new(),
            growth: Vec::new(),
            throughput: Vec::new(),
            load_at_start: load_average(),
            slow_index_mean_s: None,
        }
    }

    /// One caller-cost run of ours.
    pub fn add_probe_costs(&mut self, placement: Placement, costs: ProbeCosts) {
        self.ours_probe.push((placement, costs));
    }

    /// One growth run of ours.
    pub fn add_growth(&mut self, growth: GrowthCost) {
        self.growth.push(growth);
    }

    /// One caller-cost run of the Python design.
    pub fn add_python_probe_costs(&mut self, costs: ProbeCosts) {
        self.python_probe.push(costs);
    }

    /// One throughput run (lookups per second).
    pub fn add_throughput(&mut self, row: Row, lookups_per_s: f64) {
        self.throughput.push((row, lookups_per_s));
    }

    /// Medians, ratios and goals.
    #[must_use]
    pub fn finish(self) -> Finished {
        let ours_of = |placement| {
            let runs: Vec<ProbeCosts> = self
                .ours_probe
                .iter()
                .filter(|(p, _)| *p == placement)
                .map(|(_, c)| c.clone())
                .collect();
            median_costs(&runs)
        };
        let caller = CallerCost {
            ours_one_thread: ours_of(Placement::OneThread),
            ours_two_threads: ours_of(Placement::TwoThreads),
            python: (!self.python_probe.is_empty()).then(|| median_costs(&self.python_probe)),
        };
        let summary = |row: Row| {
            let runs: Vec<f64> = self
                .throughput
                .iter()
                .filter(|(r, _)| *r == row)
                .map(|(_, v)| *v)
                .collect();
            Summary::of(&runs)
        };
        let runs_of = |row: Row| -> Vec<f64> {
            self.throughput
                .iter()
                .filter(|(r, _)| *r == row)
                .map(|(_, v)| *v)
                .collect()
        };
        let two = |a: Row, b: Row| paired_ratio(&runs_of(a), &runs_of(b));
        let rows = Row::ALL
            .iter()
            .filter_map(|&row| {
                let summary = summary(row)?;
                let python = if row.is_slow() {
                    Row::SlowPythonBatch
                } else {
                    Row::PythonBatch
                };
                Some(RowResult {
                    row,
                    label: row.label(),
                    slow_index: row.is_slow(),
                    vs_bare: if row.is_slow() {
                        None
                    } else {
                        two(row, Row::Bare)
                    },
                    vs_n1: if row.is_slow() {
                        two(row, Row::SlowOursBatch1)
                    } else {
                        None
                    },
                    vs_python: if row.is_ours() {
                        two(row, python)
                    } else {
                        None
                    },
                    summary,
                })
            })
            .collect();
        // Python / ours for one kind of call, on the placement where ours is slower:
        // a goal must hold wherever the caller runs.
        let caller_ratio = |ours_kind: Kind, python_kind: Kind, p99: bool| {
            let python = caller.python.as_ref().and_then(python_kind)?;
            [&caller.ours_one_thread, &caller.ours_two_threads]
                .into_iter()
                .filter_map(|o| call_ratio(Some(python), ours_kind(o), p99))
                .reduce(f64::min)
        };
        let mut goals = Vec::new();
        for (what, ours_kind, python_kind) in CALLER_GOALS {
            for p99 in [false, true] {
                goals.push(Goal {
                    name: format!(
                        "caller cost, {what} {}: Python / ours",
                        if p99 { "p99" } else { "p50" }
                    ),
                    source: "goal: the caller's cost",
                    value: caller_ratio(ours_kind, python_kind, p99),
                    target: 20.0,
                });
            }
        }
        goals.extend([
            Goal {
                name: "N=1 sync / bare REQ-REP, in-memory index".into(),
                source: "goal: throughput",
                value: two(Row::OursSync, Row::Bare),
                target: 0.85,
            },
            Goal {
                name: "N=4 / N=1 (async), slow index".into(),
                source: "goal: throughput",
                value: two(Row::SlowOursBatch4, Row::SlowOursBatch1),
                target: 3.0,
            },
            Goal {
                name: "N=4 / Python design, slow index".into(),
                source: "goal: the caller's cost",
                value: two(Row::SlowOursBatch4, Row::SlowPythonBatch),
                target: 3.0,
            },
        ]);
        let limits = growth::limits(
            [&caller.ours_one_thread, &caller.ours_two_threads],
            &self.growth,
            two(Row::OursSync, Row::Bare),
        );
        Finished {
            growth: self.growth,
            limits,
            settings: self.settings,
            python_version: self.python_version,
            load_average: [self.load_at_start, load_average()],
            caller,
            caller_runs: CallerRuns {
                ours: self.ours_probe,
                python: self.python_probe,
            },
            rows,
            slow_index_mean_ms: self.slow_index_mean_s.map(|s| s * 1e3),
            goals,
        }
    }
}

/// Picks one kind of call out of [`ProbeCosts`].
type Kind = fn(&ProbeCosts) -> Option<CallCost>;

/// The caller-cost goals: what is compared, ours' kind of call, the Python design's.
/// A cached probe of ours is held against the Python call that reads the result (its
/// only read: the Python design consumes the result).
const CALLER_GOALS: [(&str, Kind, Kind); 3] = [
    ("pending probe", |c| c.pending, |c| c.pending),
    ("cached probe (Py: result read)", |c| c.cached, |c| c.ready),
    ("all calls", |c| c.all, |c| c.all),
];

/// `python / ours` of the p50 (or p99) call times; `None` when a side is missing.
fn call_ratio(python: Option<CallCost>, ours: Option<CallCost>, p99: bool) -> Option<f64> {
    #[allow(clippy::cast_precision_loss)]
    let pick = |c: CallCost| (if p99 { c.p99_ns } else { c.p50_ns }) as f64;
    python.zip(ours).and_then(|(p, o)| ratio(pick(p), pick(o)))
}

/// Per kind of call, the median over runs of each run's percentiles.
fn median_costs(runs: &[ProbeCosts]) -> ProbeCosts {
    let kind = |f: fn(&ProbeCosts) -> Option<CallCost>| {
        let v: Vec<CallCost> = runs.iter().filter_map(f).collect();
        CallCost::median_of(&v)
    };
    let timers: Vec<u64> = runs.iter().map(|r| r.timer_ns).collect();
    ProbeCosts {
        submit: kind(|c| c.submit),
        pending: kind(|c| c.pending),
        ready: kind(|c| c.ready),
        cached: kind(|c| c.cached),
        all: kind(|c| c.all),
        timer_ns: median_u64(&timers).unwrap_or(0),
    }
}

/// Caller cost per call, medians over the runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CallerCost {
    /// Ours, caller and actor on one current-thread runtime.
    pub ours_one_thread: ProbeCosts,
    /// Ours, caller thread and actor runtime thread.
    pub ours_two_threads: ProbeCosts,
    /// The Python design (absent with `--no-python`).
    pub python: Option<ProbeCosts>,
}

/// Every caller-cost run, in order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CallerRuns {
    /// Ours, with the placement of each run.
    pub ours: Vec<(Placement, ProbeCosts)>,
    /// The Python design.
    pub python: Vec<ProbeCosts>,
}

/// One throughput row reduced over the runs (lookups per second).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RowResult {
    /// Which row.
    pub row: Row,
    /// Its label in the table.
    pub label: &'static str,
    /// Whether it ran against the slow index.
    pub slow_index: bool,
    /// Lookups per second over the runs.
    pub summary: Summary,
    /// Median over the repetitions of this row's run / the bare loop's run
    /// (in-memory rows; see [`paired_ratio`]).
    pub vs_bare: Option<f64>,
    /// The same against ours N=1 async (slow rows).
    pub vs_n1: Option<f64>,
    /// The same against the Python design in the same section (our rows).
    pub vs_python: Option<f64>,
}

/// The reduced report: what the table shows and the JSON holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finished {
    /// The settings in force.
    pub settings: Settings,
    /// pyzmq's version, when the Python rows ran.
    pub python_version: Option<String>,
    /// Load averages (1, 5, 15 minutes) when the run started and when it ended.
    pub load_average: [Option<[f64; 3]>; 2],
    /// Caller cost per call (medians).
    pub caller: CallerCost,
    /// Every caller-cost run.
    pub caller_runs: CallerRuns,
    /// Throughput rows.
    pub rows: Vec<RowResult>,
    /// Measured mean time of one slow-index call (ms).
    pub slow_index_mean_ms: Option<f64>,
    /// The goals (`bench/README.md`) and the measured ratios.
    pub goals: Vec<Goal>,
    /// Every growth run.
    pub growth: Vec<GrowthCost>,
    /// The caller-cost limits as tracked requests grow.
    pub limits: Vec<Limit>,
}

/// `1234567.8` → `"1,234,568"`.
#[must_use]
pub fn thousands(value: f64) -> String {
    if !value.is_finite() {
        return "-".into();
    }
    #[allow(clippy::cast_possible_truncation)]
    let rounded = value.round() as i64;
    let digits = rounded.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if rounded < 0 {
        out.insert(0, '-');
    }
    out
}

fn times(value: Option<f64>) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.2}x"))
}

fn count(cost: Option<CallCost>) -> String {
    cost.map_or_else(|| "0".into(), |c| thousands(c.n as f64))
}

fn ns(cost: Option<CallCost>, p99: bool) -> String {
    cost.map_or_else(
        || "-".into(),
        |c| thousands(if p99 { c.p99_ns } else { c.p50_ns } as f64),
    )
}

impl Finished {
    /// Section 1 of the table: caller cost per call.
    fn caller_table(&self, w: &mut String) {
        let s = &self.settings;
        let c = &self.caller;
        let _ = writeln!(
            w,
            "\n1. Caller cost per call (ns; median over runs of each run's p50 and p99; one clock \
             read included: Rust {} ns, Python {} ns)",
            c.ours_one_thread.timer_ns,
            c.python
                .as_ref()
                .map_or_else(|| "-".into(), |p| p.timer_ns.to_string()),
        );
        let _ = writeln!(
            w,
            "   loop: {} requests, {} arriving per {} us step, each waiting request probed once a \
             step, against the slow index;\n   async mode, no prefetch (the first probe submits), \
             max_in_flight 1 (the Python design: one worker)",
            thousands(s.probe_count as f64),
            s.arrivals_per_step,
            s.step_us
        );
        let _ = writeln!(
            w,
            "   {:<34} {:>16} {:>16} {:>16} {:>16} {:>16}",
            "",
            "ours, 1 thread",
            "ours, 2 threads",
            "Python design",
            "Py / ours 1T",
            "Py / ours 2T"
        );
        let _ = writeln!(
            w,
            "   {:<34} {:>7} {:>8} {:>7} {:>8} {:>7} {:>8} {:>7} {:>8} {:>7} {:>8}   calls: 1T / 2T / Py",
            "call", "p50", "p99", "p50", "p99", "p50", "p99", "p50", "p99", "p50", "p99"
        );
        let kinds: [(&str, Kind, Kind); 5] = [
            ("first probe (submits)", |c| c.submit, |c| c.submit),
            ("probe, lookup pending", |c| c.pending, |c| c.pending),
            ("probe, answer ready (first read)", |c| c.ready, |c| c.ready),
            ("probe, cached (Py: first read)", |c| c.cached, |c| c.ready),
            ("all: first + pending + ready", |c| c.all, |c| c.all),
        ];
        for (name, ours_kind, python_kind) in kinds {
            let one = ours_kind(&c.ours_one_thread);
            let two = ours_kind(&c.ours_two_threads);
            let py = c.python.as_ref().and_then(python_kind);
            let _ = writeln!(
                w,
                "   {:<34} {:>7} {:>8} {:>7} {:>8} {:>7} {:>8} {:>7} {:>8} {:>7} {:>8}   {} / {} / {}",
                name,
                ns(one, false),
                ns(one, true),
                ns(two, false),
                ns(two, true),
                ns(py, false),
                ns(py, true),
                times(call_ratio(py, one, false)),
                times(call_ratio(py, one, true)),
                times(call_ratio(py, two, false)),
                times(call_ratio(py, two, true)),
                count(one),
                count(two),
                count(py),
            );
        }
    }

    /// The table: caller cost, throughput in both sections, goals.
    #[must_use]
    pub fn table(&self) -> String {
        let s = &self.settings;
        let mut out = String::new();
        let w = &mut out;
        let request_bytes = 4 + 2 + 6 + s.blocks * s.hash_len;
        let _ = writeln!(
            w,
            "\nLookup channel over ipc; every lookup: {} block hashes x {} bytes ({} request bytes), \
             num_tokens {}, block size {}, tagged-blob; every answer checked ({} hit tokens).",
            s.blocks,
            s.hash_len,
            thousands(request_bytes as f64),
            s.blocks * s.block_size as usize + 1,
            s.block_size,
            s.blocks * s.block_size as usize,
        );
        let load = |l: Option<[f64; 3]>| l.map_or_else(|| "-".into(), |l| format!("{:.2}", l[0]));
        let _ = writeln!(
            w,
            "Medians over {} runs, rows interleaved; servers on threads of their own; pyzmq {}; \
             load average (1 min) {} at start, {} at end, on {} cores.",
            s.reps,
            self.python_version.as_deref().unwrap_or("-"),
            load(self.load_average[0]),
            load(self.load_average[1]),
            std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        );

        if s.sections.contains(&Section::Caller) {
            self.caller_table(w);
        }
        for slow in [false, true] {
            if !self.rows.iter().any(|r| r.slow_index == slow) {
                continue;
            }
            if slow {
                let _ = writeln!(
                    w,
                    "\n3. Lookups per second, index {} ms per call ({}; measured {}), {} lookups per run",
                    s.index_ms,
                    match s.delay {
                        DelayKind::Precise => "blocking-pool thread sleep",
                        DelayKind::Tokio => "DelayedIndex, tokio timer",
                    },
                    self.slow_index_mean_ms
                        .map_or_else(|| "-".into(), |m| format!("{m:.3} ms")),
                    thousands(s.slow_count as f64),
                );
            } else {
                let _ = writeln!(
                    w,
                    "\n2. Lookups per second, in-memory index, {} lookups per run; batch = {} requests arriving together",
                    thousands(s.count as f64),
                    s.batch
                );
            }
            let _ = writeln!(
                w,
                "   {:<46} {:>9} {:>19} {:>8} {:>10}",
                "",
                "lookups/s",
                "min-max",
                if slow { "x N=1 *" } else { "x bare *" },
                "x Python *"
            );
            for r in self.rows.iter().filter(|r| r.slow_index == slow) {
                let _ = writeln!(
                    w,
                    "   {:<46} {:>9} {:>19} {:>8} {:>10}",
                    r.label,
                    thousands(r.summary.median),
                    format!("{}-{}", thousands(r.summary.min), thousands(r.summary.max)),
                    times(if slow { r.vs_n1 } else { r.vs_bare }),
                    times(r.vs_python),
                );
            }
        }

        if !self.rows.is_empty() {
            let _ = writeln!(
                w,
                "   * median over the repetitions of run / run of the same repetition (rows of \
                 one repetition meet the same load), not a ratio of medians"
            );
        }

        let _ = writeln!(w, "\nGoals");
        for g in &self.goals {
            let _ = writeln!(
                w,
                "   {:<9} {:<62} {:>8} (target >= {}; {})",
                if g.value.is_none() {
                    "[n/a]"
                } else if g.met() {
                    "[met]"
                } else {
                    "[not met]"
                },
                g.name,
                g.value.map_or_else(|| "-".into(), |v| format!("{v:.3}x")),
                g.target,
                g.source
            );
        }
        let two_threads = self
            .rows
            .iter()
            .find(|r| r.row == Row::OursSyncTwoThreads)
            .zip(self.rows.iter().find(|r| r.row == Row::OursSync))
            .and_then(|(two, one)| ratio(two.summary.median, one.summary.median));
        let _ = writeln!(
            w,
            "   Placement: the throughput goals use ours with caller and actor on one \
             current-thread runtime (two threads ran at {} of it);\n   each caller-cost goal \
             takes the worse of the two placements.",
            times(two_threads)
        );
        out.push_str(&growth::table(&self.growth, &self.limits));
        out
    }
}
