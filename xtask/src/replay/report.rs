//! Summaries of replay runs and the side-by-side table (the simulator's layout: one
//! row per figure, one column per run).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::Transport;
use super::engine::{self, EngineResult};
use super::peers;
use crate::simulate::engine::Sample;
use crate::simulate::mode::Mode;
use crate::simulate::report::Percentiles;

/// Latency percentiles in microseconds, measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencyUs {
    /// Samples.
    pub count: u64,
    /// Median (µs).
    pub p50: f64,
    /// 99th percentile (µs).
    pub p99: f64,
    /// Mean (µs).
    pub mean: f64,
}

impl LatencyUs {
    /// Percentiles of a histogram recorded in µs.
    #[must_use]
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            count: h.len(),
            p50: h.value_at_quantile(0.5) as f64,
            p99: h.value_at_quantile(0.99) as f64,
            mean: h.mean(),
        }
    }
}

/// One run's figures (one mode over one transport), as printed and written to JSON.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSummary {
    /// The lookup mode.
    pub mode: Mode,
    /// The transport.
    pub transport: Transport,
    /// Requests replayed.
    pub requests: u64,
    /// Requests that finished.
    pub finished: u64,
    /// Requests that got their first token.
    pub first_tokens: u64,
    /// TTFT, arrival to the first token (ms).
    pub ttft_ms: Percentiles,
    /// Arrival to first scheduling, mean (ms).
    pub queue_wait_mean_ms: f64,
    /// Step-loop time spent waiting for lookups (sync probes, `prefetch+wait`), s.
    pub engine_blocked_s: f64,
    /// Eligible requests whose lookup was ready at their first probe (the core's
    /// `first_probes_ready / (ready + pending)`); `None` when none was probed.
    pub ready_at_first_probe: Option<f64>,
    /// Probes answered `Pending` that deferred a request to a later step.
    pub lookups_deferred: u64,
    /// First probes answered `Pending` on an idle engine (nothing running or loading),
    /// which probes a request the moment it arrives, before any lookup can answer.
    pub first_pending_idle: u64,
    /// Lookup RPCs from the send to their end (the events' `on_wire`), measured.
    pub lookup_on_wire_us: LatencyUs,
    /// Lookup RPCs from submission to their end (the events' `total`), measured.
    pub lookup_total_us: LatencyUs,
    /// How lookup RPCs ended.
    pub outcomes: engine::Outcomes,
    /// Lookup RPCs sent.
    pub rpcs_sent: u64,
    /// Lookups that joined an RPC already queued or in flight.
    pub rpcs_shared: u64,
    /// RPCs that ended with no live request to answer.
    pub rpcs_wasted: u64,
    /// RPCs cancelled before they were sent.
    pub rpcs_cancelled: u64,
    /// Results looked up again after the TTL.
    pub ttl_refreshes: u64,
    /// Tokens loaded from the store instead of computed.
    pub external_hit_tokens: u64,
    /// Keys the Python client stored.
    pub keys_written: u64,
    /// Keys whose put failed.
    pub put_errors: u64,
    /// End of a prefill to its blocks' put answered (ms).
    pub put_lag_ms: LatencyUs,
    /// Direct transport: `BatchExistKey` calls of the clients' master connections
    /// (ZeroMQ: of the server's `MooncakeIndex`).
    pub batch_exist_calls: u64,
    /// The master's own counters over the run (differences) and gauges at its end,
    /// scraped from its metrics port; empty when it was not reachable.
    pub master: BTreeMap<String, f64>,
    /// Steps run, all engines.
    pub steps: u64,
    /// First arrival to last finish (s).
    pub makespan_s: f64,
    /// Recompute preemptions, all engines.
    pub preemptions: u64,
    /// Most preemptions of one request.
    pub preemptions_max: u32,
    /// Every engine's state once a second from the first arrival (waiting, running,
    /// KV blocks held), as the simulator's `--timeseries`.
    pub timeseries: Vec<Sample>,
}

impl RunSummary {
    /// The column label, `mode/transport`.
    #[must_use]
    pub fn label(&self) -> String {
        format!("{}/{}", self.mode.name(), self.transport.name())
    }
}

/// Rows of the table: label, and the cell of a run.
type Row = (&'static str, fn(&RunSummary) -> String);

fn master_cell(s: &RunSummary, series: &str) -> String {
    s.master
        .get(series)
        .map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"))
}

/// Keys put through single and batched PutStart: `single` requests (one key each) plus
/// `batched` items.
fn master_sum(s: &RunSummary, single: &str, batched: &str) -> String {
    match (s.master.get(single), s.master.get(batched)) {
        (None, None) => "-".to_owned(),
        (a, b) => format!(
            "{:.0}",
            a.copied().unwrap_or(0.0) + b.copied().unwrap_or(0.0)
        ),
    }
}

/// The side-by-side table: one row per figure, one column per run.
#[must_use]
pub fn table(runs: &[RunSummary]) -> String {
    let rows: [Row; 34] = [
        ("requests finished", |s| {
            format!("{}/{}", s.finished, s.requests)
        }),
        ("TTFT p50 (ms)", |s| format!("{:.1}", s.ttft_ms.p50)),
        ("TTFT p90 (ms)", |s| format!("{:.1}", s.ttft_ms.p90)),
        ("TTFT p99 (ms)", |s| format!("{:.1}", s.ttft_ms.p99)),
        ("TTFT mean (ms)", |s| format!("{:.1}", s.ttft_ms.mean)),
        ("queue wait mean (ms)", |s| {
            format!("{:.1}", s.queue_wait_mean_ms)
        }),
        ("engine blocked on lookups (s)", |s| {
            format!("{:.3}", s.engine_blocked_s)
        }),
        ("ready at first probe", |s| {
            s.ready_at_first_probe
                .map_or_else(|| "-".into(), |f| format!("{:.1}%", f * 100.0))
        }),
        ("  not ready: engine idle at arrival", |s| {
            s.first_pending_idle.to_string()
        }),
        ("lookups deferred", |s| s.lookups_deferred.to_string()),
        ("lookup latency on wire p50 (µs)", |s| {
            format!("{:.0}", s.lookup_on_wire_us.p50)
        }),
        ("lookup latency on wire p99 (µs)", |s| {
            format!("{:.0}", s.lookup_on_wire_us.p99)
        }),
        ("lookup latency total p50 (µs)", |s| {
            format!("{:.0}", s.lookup_total_us.p50)
        }),
        ("lookup latency total p99 (µs)", |s| {
            format!("{:.0}", s.lookup_total_us.p99)
        }),
        ("lookups hit / miss", |s| {
            format!("{} / {}", s.outcomes.hit, s.outcomes.miss)
        }),
        ("lookups failed / timed out", |s| {
            format!(
                "{} / {}",
                s.outcomes.failed + s.outcomes.malformed,
                s.outcomes.timed_out
            )
        }),
        ("RPCs sent", |s| s.rpcs_sent.to_string()),
        ("RPCs shared", |s| s.rpcs_shared.to_string()),
        ("RPCs wasted", |s| s.rpcs_wasted.to_string()),
        ("TTL refreshes", |s| s.ttl_refreshes.to_string()),
        ("external hit tokens", |s| s.external_hit_tokens.to_string()),
        ("keys written / put errors", |s| {
            format!("{} / {}", s.keys_written, s.put_errors)
        }),
        ("put lag p50 / p99 (ms)", |s| {
            format!("{:.1} / {:.1}", s.put_lag_ms.p50, s.put_lag_ms.p99)
        }),
        ("BatchExistKey calls (client)", |s| {
            s.batch_exist_calls.to_string()
        }),
        ("master: BatchExistKey requests", |s| {
            master_cell(s, "master_batch_exist_key_requests_total")
        }),
        ("master: BatchExistKey keys", |s| {
            master_cell(s, "master_batch_exist_key_items_total")
        }),
        ("master: BatchExistKey failures", |s| {
            master_cell(s, "master_batch_exist_key_failures_total")
        }),
        ("master: PutStart keys / failures", |s| {
            format!(
                "{} / {}",
                master_sum(
                    s,
                    "master_put_start_requests_total",
                    "master_batch_put_start_items_total"
                ),
                master_sum(
                    s,
                    "master_put_start_failures_total",
                    "master_batch_put_start_failed_items_total"
                )
            )
        }),
        ("master: keys / evicted (end)", |s| {
            format!(
                "{} / {}",
                master_cell(s, "master_key_count"),
                master_cell(s, "master_evicted_key_count")
            )
        }),
        ("master: allocated bytes (end)", |s| {
            master_cell(s, "master_allocated_bytes")
        }),
        ("preemptions", |s| s.preemptions.to_string()),
        ("preemptions per request, max", |s| {
            s.preemptions_max.to_string()
        }),
        ("steps", |s| s.steps.to_string()),
        ("makespan (s)", |s| format!("{:.1}", s.makespan_s)),
    ];
    let labels: Vec<String> = runs.iter().map(RunSummary::label).collect();
    let label_w = rows
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|(_, f)| runs.iter().map(f).collect())
        .collect();
    let col_w: Vec<usize> = (0..runs.len())
        .map(|c| {
            cells
                .iter()
                .map(|row| row[c].chars().count())
                .chain(std::iter::once(labels[c].len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let pad = |s: &str, w: usize| " ".repeat(w.saturating_sub(s.chars().count()));
    out.push_str(&" ".repeat(label_w));
    for (label, w) in labels.iter().zip(&col_w) {
        let _ = write!(out, "  {}{label}", pad(label, *w));
    }
    out.push('\n');
    for ((label, _), row) in rows.iter().zip(&cells) {
        let _ = write!(out, "{label}{}", pad(label, label_w));
        for (cell, w) in row.iter().zip(&col_w) {
            let _ = write!(out, "  {}{cell}", pad(cell, *w));
        }
        out.push('\n');
    }
    out
}

/// Lines comparing the direct transport's measured lookup latency with ZeroMQ's, per
/// mode run over both (`direct / zmq`, on the wire and in total).
#[must_use]
pub fn ratios(runs: &[RunSummary]) -> String {
    let mut out = String::new();
    for direct in runs.iter().filter(|r| r.transport == Transport::Direct) {
        let Some(zmq) = runs
            .iter()
            .find(|r| r.transport == Transport::Zmq && r.mode == direct.mode)
        else {
            continue;
        };
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        let _ = writeln!(
            out,
            "{}: lookup latency direct/zmq on the wire p50 {:.2}, p99 {:.2}; total p50 {:.2}, p99 {:.2}",
            direct.mode,
            ratio(direct.lookup_on_wire_us.p50, zmq.lookup_on_wire_us.p50),
            ratio(direct.lookup_on_wire_us.p99, zmq.lookup_on_wire_us.p99),
            ratio(direct.lookup_total_us.p50, zmq.lookup_total_us.p50),
            ratio(direct.lookup_total_us.p99, zmq.lookup_total_us.p99),
        );
    }
    out
}

/// Sums the engines' measurements into the run's summary.
#[allow(clippy::too_many_arguments)]
pub(super) fn summarise(
    mode: Mode,
    transport: Transport,
    requests: usize,
    t0: Instant,
    results: &[EngineResult],
    writer: &peers::WriterStats,
    batch_exist_calls: u64,
    master: BTreeMap<String, f64>,
) -> RunSummary {
    let new = || Histogram::<u64>::new(3).expect("3 significant digits is a valid histogram");
    let (mut ttft, mut on_wire, mut total) = (new(), new(), new());
    let mut queue_wait = Duration::ZERO;
    let mut queued = 0u64;
    let mut s = RunSummary {
        mode,
        transport,
        requests: requests as u64,
        finished: 0,
        first_tokens: 0,
        ttft_ms: Percentiles {
            p50: 0.0,
            p90: 0.0,
            p99: 0.0,
            mean: 0.0,
            max: 0.0,
        },
        queue_wait_mean_ms: 0.0,
        engine_blocked_s: 0.0,
        ready_at_first_probe: None,
        lookups_deferred: 0,
        first_pending_idle: 0,
        lookup_on_wire_us: LatencyUs::default(),
        lookup_total_us: LatencyUs::default(),
        outcomes: engine::Outcomes::default(),
        rpcs_sent: 0,
        rpcs_shared: 0,
        rpcs_wasted: 0,
        rpcs_cancelled: 0,
        ttl_refreshes: 0,
        external_hit_tokens: 0,
        keys_written: writer.keys_written,
        put_errors: writer.put_errors,
        put_lag_ms: LatencyUs::default(),
        batch_exist_calls,
        master,
        steps: 0,
        makespan_s: 0.0,
        preemptions: 0,
        preemptions_max: 0,
        timeseries: Vec::new(),
    };
    let (mut ready, mut pending) = (0u64, 0u64);
    let mut last = t0;
    for (e, r) in results.iter().enumerate() {
        s.preemptions += r.preemptions;
        s.preemptions_max = s.preemptions_max.max(r.preemptions_max);
        s.timeseries.extend(r.samples.iter().map(|x| Sample {
            engine: e as u32,
            ..x.clone()
        }));
        for &(_, t) in &r.ttft {
            let _ = ttft.record(u64::try_from(t.as_micros()).unwrap_or(u64::MAX).max(1));
        }
        s.first_tokens += r.ttft.len() as u64;
        for w in &r.queue_wait {
            queue_wait += *w;
            queued += 1;
        }
        let _ = on_wire.add(&r.on_wire_us);
        let _ = total.add(&r.total_us);
        s.finished += r.finished;
        s.engine_blocked_s += r.blocked.as_secs_f64();
        s.lookups_deferred += r.deferred;
        s.first_pending_idle += r.first_pending_idle;
        s.steps += r.steps;
        s.external_hit_tokens += r.external_hit_tokens;
        let o = &mut s.outcomes;
        o.hit += r.outcomes.hit;
        o.miss += r.outcomes.miss;
        o.malformed += r.outcomes.malformed;
        o.timed_out += r.outcomes.timed_out;
        o.failed += r.outcomes.failed;
        let c = &r.stats.core;
        s.rpcs_sent += r.stats.rpcs_sent;
        s.rpcs_shared += c.rpcs_shared;
        s.rpcs_wasted += c.replies_stale;
        s.rpcs_cancelled += c.rpcs_cancelled;
        s.ttl_refreshes += c.ttl_refreshes;
        ready += c.first_probes_ready;
        pending += c.first_probes_pending;
        if let Some(at) = r.last_finish {
            last = last.max(at);
        }
    }
    if !ttft.is_empty() {
        let q = |p: f64| ttft.value_at_quantile(p) as f64 / 1e3;
        s.ttft_ms = Percentiles {
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            mean: ttft.mean() / 1e3,
            max: ttft.max() as f64 / 1e3,
        };
    }
    if queued > 0 {
        s.queue_wait_mean_ms = queue_wait.as_secs_f64() * 1e3 / queued as f64;
    }
    s.ready_at_first_probe = (ready + pending > 0).then(|| ready as f64 / (ready + pending) as f64);
    s.lookup_on_wire_us = LatencyUs::of(&on_wire);
    s.lookup_total_us = LatencyUs::of(&total);
    let lag = LatencyUs::of(&writer.lag_us);
    s.put_lag_ms = LatencyUs {
        count: lag.count,
        p50: lag.p50 / 1e3,
        p99: lag.p99 / 1e3,
        mean: lag.mean / 1e3,
    };
    s.makespan_s = last.saturating_duration_since(t0).as_secs_f64();
    s.timeseries.sort_by_key(|x| (x.t_ms, x.engine));
    s
}
