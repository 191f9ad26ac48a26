//! The caller's cost while the request table grows, and its limits:
//! submit ≤ 1 µs p50; pending, ready and cached probes ≤ 100 ns
//! p50; any handle call ≤ 100 µs while tracked requests grow from 0 to 100,000; N=1
//! sync / bare tmq REQ-REP ≥ 0.9×.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::ensure;
use lookup_tokio::{ClientConfig, Endpoint, LookupClient};
use serde::Serialize;

use super::ours::ProbeCosts;
use super::payload::Payload;
use super::stats::CallCost;

/// Requests tracked at the end of a growth run .
pub const GROWTH_REQUESTS: usize = 100_000;

/// One growth run: every arrival's cost while the table grew.
///
/// Two clocks: wall-clock time includes the time the thread was descheduled (on a
/// shared 2-core machine another process can take the core for milliseconds in the
/// middle of any call); the thread's CPU time counts only what the call itself did,
/// in user and kernel mode (page faults of a growing table included). The limit is
/// judged on the CPU time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GrowthCost {
    /// Requests tracked at the end (each arrival added one).
    pub tracked_requests: usize,
    /// Percentiles of the arrivals (wall clock, ns, one clock read included).
    pub arrivals: CallCost,
    /// The slowest arrival, wall clock (ns).
    pub max_ns: u64,
    /// The slowest arrival in the thread's CPU time (ns, two CPU-clock reads
    /// included).
    pub max_cpu_ns: u64,
    /// The arrival (0-based) that took `max_cpu_ns`.
    pub max_cpu_at: usize,
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), ns.
fn thread_cpu_ns() -> anyhow::Result<u64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)?;
    let ns = i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec());
    Ok(u64::try_from(ns).unwrap_or(0))
}

/// `count` distinct requests arrive one after another (`on_new_request`, async mode,
/// prefetch limit 64, so the table holds every request and at most 64 of them have a
/// lookup); each call is timed. The I/O task runs on a current-thread runtime that the
/// loop does not drive, so the caller's thread does only the caller's work.
///
/// # Errors
/// When the client cannot connect, or it does not track exactly `count` requests at
/// the end.
pub(crate) fn growth_cost(
    endpoint: &Endpoint,
    payload: &Payload,
    count: usize,
) -> anyhow::Result<GrowthCost> {
    let runtime = super::peers::current_thread_runtime()?;
    let mut config = ClientConfig::zmq(endpoint.clone(), payload.block_size);
    config.core.lookup_async = true;
    config.core.lookup_prefetch_limit = 64;
    config.core.lookup_share = false;
    let mut client = LookupClient::connect_lazy_with_handle(config, runtime.handle())?;
    let mut samples = Vec::with_capacity(count);
    let (mut max_cpu_ns, mut max_cpu_at) = (0, 0);
    for i in 0..count {
        let req = payload.request(i as u64);
        let cpu0 = thread_cpu_ns()?;
        let t0 = Instant::now();
        client.on_new_request(&req);
        samples.push(nanos(t0.elapsed()));
        let cpu = thread_cpu_ns()?.saturating_sub(cpu0);
        if cpu > max_cpu_ns {
            (max_cpu_ns, max_cpu_at) = (cpu, i);
        }
    }
    let tracked = client.stats().tracked_requests;
    runtime.block_on(client.shutdown());
    ensure!(
        tracked == count,
        "{count} arrivals left {tracked} tracked requests"
    );
    let max_ns = samples.iter().copied().max().unwrap_or(0);
    let arrivals = CallCost::from_samples(&mut samples)
        .ok_or_else(|| anyhow::anyhow!("a growth run needs at least one arrival"))?;
    Ok(GrowthCost {
        tracked_requests: tracked,
        arrivals,
        max_ns,
        max_cpu_ns,
        max_cpu_at,
    })
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A limit of the growth goal and what one run measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Limit {
    /// What is measured.
    pub name: &'static str,
    /// The measured value (ns, or a ratio); `None` when not measured.
    pub value: Option<f64>,
    /// The limit.
    pub bound: f64,
    /// True when the value must be at most the bound (a time), false when at least
    /// (a ratio).
    pub at_most: bool,
}

impl Limit {
    /// True when measured and within the bound.
    #[must_use]
    pub fn met(&self) -> bool {
        self.value.is_some_and(|v| {
            if self.at_most {
                v <= self.bound
            } else {
                v >= self.bound
            }
        })
    }
}

/// The limits from the caller-cost medians (the worse of the two placements for each
/// kind of call), the slowest arrival over the growth runs, and the N=1 sync / bare
/// ratio.
#[must_use]
pub fn limits(
    placements: [&ProbeCosts; 2],
    growth: &[GrowthCost],
    sync_vs_bare: Option<f64>,
) -> Vec<Limit> {
    #[allow(clippy::cast_precision_loss)]
    let worst = |kind: fn(&ProbeCosts) -> Option<CallCost>| {
        placements
            .iter()
            .filter_map(|p| kind(p))
            .map(|c| c.p50_ns as f64)
            .reduce(f64::max)
    };
    #[allow(clippy::cast_precision_loss)]
    let slowest = growth.iter().map(|g| g.max_cpu_ns as f64).reduce(f64::max);
    vec![
        Limit {
            name: "submit (first probe) p50, ns",
            value: worst(|c| c.submit),
            bound: 1_000.0,
            at_most: true,
        },
        Limit {
            name: "pending probe p50, ns",
            value: worst(|c| c.pending),
            bound: 100.0,
            at_most: true,
        },
        Limit {
            name: "ready probe p50, ns",
            value: worst(|c| c.ready),
            bound: 100.0,
            at_most: true,
        },
        Limit {
            name: "cached probe p50, ns",
            value: worst(|c| c.cached),
            bound: 100.0,
            at_most: true,
        },
        Limit {
            name: "slowest arrival (CPU time), tracked 0 -> 100,000, ns",
            value: slowest,
            bound: 100_000.0,
            at_most: true,
        },
        Limit {
            name: "N=1 sync / bare REQ-REP, in-memory index",
            value: sync_vs_bare,
            bound: 0.9,
            at_most: false,
        },
    ]
}

/// The growth figures and the limits, for the table.
#[must_use]
pub fn table(growth: &[GrowthCost], limits: &[Limit]) -> String {
    let mut out = String::new();
    let w = &mut out;
    if let Some(last) = growth.last() {
        let median = |f: fn(&GrowthCost) -> u64| {
            let v: Vec<u64> = growth.iter().map(f).collect();
            super::stats::median_u64(&v).unwrap_or(0)
        };
        let _ = writeln!(
            w,
            "\n4. Arrivals while the request table grows to {} tracked requests (ns; median over runs)\n   \
             wall clock: p50 {}, p99 {}, slowest {}; thread CPU time: slowest {} (arrivals {:?})",
            super::report::thousands(last.tracked_requests as f64),
            median(|g| g.arrivals.p50_ns),
            median(|g| g.arrivals.p99_ns),
            median(|g| g.max_ns),
            super::report::thousands(median(|g| g.max_cpu_ns) as f64),
            growth.iter().map(|g| g.max_cpu_at).collect::<Vec<_>>(),
        );
    }
    let _ = writeln!(w, "\nCaller-cost limits ");
    for l in limits {
        let _ = writeln!(
            w,
            "   {:<9} {:<52} {:>10} ({} {})",
            if l.value.is_none() {
                "[n/a]"
            } else if l.met() {
                "[met]"
            } else {
                "[not met]"
            },
            l.name,
            l.value.map_or_else(
                || "-".into(),
                |v| if l.at_most {
                    super::report::thousands(v)
                } else {
                    format!("{v:.3}x")
                }
            ),
            if l.at_most { "at most" } else { "at least" },
            if l.at_most {
                super::report::thousands(l.bound)
            } else {
                format!("{:.1}x", l.bound)
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_is_met_only_within_its_bound() {
        let time = |value| Limit {
            name: "t",
            value,
            bound: 100.0,
            at_most: true,
        };
        assert!(time(Some(100.0)).met());
        assert!(!time(Some(101.0)).met());
        assert!(!time(None).met());
        let ratio = Limit {
            name: "r",
            value: Some(0.89),
            bound: 0.9,
            at_most: false,
        };
        assert!(!ratio.met());
        assert!(
            Limit {
                value: Some(0.9),
                ..ratio
            }
            .met()
        );
    }
}
