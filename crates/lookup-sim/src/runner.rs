//! Running many simulations at once: every (settings, mode) job on its own pass over
//! the trace, spread over every core (`std::thread::scope`, workers taking the next
//! job from a shared counter; each run is deterministic and independent, so the
//! order they run in changes nothing), and the perturbed reruns that show a figure's
//! spread.

use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;

use super::engine::{ModeResult, RequestRecord, SimParams, simulate};
use super::hash::mix;
use super::mode::Mode;
use super::trace::TraceSource;

/// One simulation to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// Its settings.
    pub params: SimParams,
    /// Its mode.
    pub mode: Mode,
}

/// The arrival-rate factor of rerun `repeat`: 1 for the first run, then +1 %, −1 %,
/// +0.5 %, −0.5 %, +0.33 %, ...
#[must_use]
pub fn rate_factor(repeat: u32) -> f64 {
    if repeat == 0 {
        return 1.0;
    }
    let step = 0.01 / f64::from(repeat.div_ceil(2));
    if repeat % 2 == 1 {
        1.0 + step
    } else {
        1.0 - step
    }
}

/// Rerun `repeat` of `params`, each perturbation drawn on its own: the server's
/// jitter seed moved by `repeat`, the arrival rate scaled by [`rate_factor`], the
/// requests of each burst (one timestamp) shuffled by a seed of their own, and the
/// routing moved by an offset of its own (mod the engines). Rerun 0 is `params`
/// itself; only it keeps `timeseries`.
#[must_use]
pub fn perturbed(params: &SimParams, repeat: u32) -> SimParams {
    let mut p = params.clone();
    if repeat == 0 {
        return p;
    }
    let draw = |salt: u64| mix(params.seed ^ mix(u64::from(repeat) ^ salt));
    p.seed = params.seed.wrapping_add(u64::from(repeat));
    p.rate_scale = params.rate_scale * rate_factor(repeat);
    p.order_seed = draw(0x006f_7264_6572) | 1;
    p.route_offset = (draw(0x0072_6f75_7465) % u64::from(params.engine.engines.max(1))) as u32;
    p.timeseries = false;
    p
}

/// Worker threads for `jobs` jobs: one per core, at most one per job.
#[must_use]
pub fn workers(jobs: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .min(jobs)
        .max(1)
}

/// Runs every job, each on a fresh pass over `source` (its first `limit` requests),
/// on [`workers`] threads. `on_finished(job, record)` is called for every finished
/// request. Results come in job order.
///
/// # Errors
/// The first failing job's error, naming its mode (see [`simulate`]); the trace
/// cannot be opened.
pub fn run_jobs(
    source: &TraceSource,
    limit: Option<usize>,
    jobs: &[Job],
    on_finished: &(dyn Fn(usize, &RequestRecord) + Sync),
) -> anyhow::Result<Vec<ModeResult>> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<anyhow::Result<ModeResult>>>> =
        Mutex::new(jobs.iter().map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..workers(jobs.len()) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    let out = source
                        .open(limit)
                        .map_err(anyhow::Error::from)
                        .and_then(|trace| {
                            simulate(trace, job.mode, &job.params, &|r| on_finished(i, r))
                        })
                        .with_context(|| format!("{}: {} mode", source.describe(), job.mode));
                    let failed = out.is_err();
                    results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(out);
                    if failed {
                        // Nobody needs the rest.
                        next.store(jobs.len(), Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::with_capacity(jobs.len());
    let mut skipped = false;
    for r in results {
        match r {
            Some(r) => out.push(r?),
            None => skipped = true,
        }
    }
    anyhow::ensure!(!skipped, "a simulation thread stopped early");
    Ok(out)
}

/// Runs every mode of `modes` once on `source` with `params`, one job each, on every
/// core; results in `modes` order.
///
/// # Errors
/// As [`run_jobs`].
pub fn run_modes(
    source: &TraceSource,
    limit: Option<usize>,
    modes: &[Mode],
    params: &SimParams,
    on_finished: &(dyn Fn(usize, &RequestRecord) + Sync),
) -> anyhow::Result<Vec<ModeResult>> {
    let jobs: Vec<Job> = modes
        .iter()
        .map(|&mode| Job {
            params: params.clone(),
            mode,
        })
        .collect();
    run_jobs(source, limit, &jobs, on_finished)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reruns_move_the_seed_and_the_rate_by_one_percent_at_most() {
        assert_eq!(
            (0..6).map(rate_factor).collect::<Vec<_>>(),
            [1.0, 1.01, 0.99, 1.005, 0.995, 1.0 + 0.01 / 3.0]
        );
        let p = SimParams::default();
        assert_eq!(perturbed(&p, 0), p);
        let q = perturbed(&p, 2);
        assert_eq!((q.seed, q.rate_scale), (2, 0.99));
        // Order and routing are drawn on their own: ten reruns give ten shuffles and
        // use every offset of the four engines.
        let reruns: Vec<SimParams> = (1..=10).map(|i| perturbed(&p, i)).collect();
        let mut orders: Vec<u64> = reruns.iter().map(|r| r.order_seed).collect();
        orders.sort_unstable();
        orders.dedup();
        assert_eq!(orders.len(), 10);
        assert!(orders.iter().all(|&o| o != 0));
        let mut offsets: Vec<u32> = reruns.iter().map(|r| r.route_offset).collect();
        offsets.sort_unstable();
        offsets.dedup();
        assert_eq!(offsets, [0, 1, 2, 3]);
    }
}
