//! Our `LookupClient` in the benchmark's loops.
//!
//! Two placements of the caller and the I/O actor (the task that owns the socket):
//!
//! - one thread: a current-thread runtime on the caller's thread carries the actor,
//!   which runs whenever the caller awaits (`probe_until(Answer)`, `wait_progress`); no
//!   cross-thread wake-up on the lookup's path;
//! - two threads: the caller on its own thread, the actor on a one-worker runtime
//!   ([`LookupClient::connect_with_handle`]); the caller blocks in `probe_until_blocking(Answer)`
//!   or sleeps between steps, and every reply crosses threads.

use lookup_tokio::Deadline;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use lookup_core::Probe;
use lookup_tokio::{ClientConfig, Endpoint, LookupClient};
use serde::Serialize;
use tokio::runtime::Runtime;

use super::payload::Payload;
use super::peers::per_second;
use super::stats::CallCost;

/// Where the caller and the I/O actor run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Caller and actor on one current-thread runtime, on the caller's thread.
    OneThread,
    /// Caller on its thread; actor on a one-worker multi-thread runtime.
    TwoThreads,
}

impl Placement {
    /// How the table names it.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Self::OneThread => "caller+actor on one current-thread runtime",
            Self::TwoThreads => "caller thread + actor runtime thread",
        }
    }
}

/// The client configuration of every run: block size of the payload, `max_in_flight`
/// RPCs on the wire, async mode with `prefetch_limit` arrival-time lookups or sync mode.
fn config(
    endpoint: &Endpoint,
    payload: &Payload,
    lookup_async: bool,
    prefetch_limit: u32,
    max_in_flight: u32,
) -> ClientConfig {
    let mut config = ClientConfig::zmq(endpoint.clone(), payload.block_size);
    config.core.lookup_async = lookup_async;
    config.core.lookup_prefetch_limit = prefetch_limit;
    config.core.max_in_flight = max_in_flight;
    // Every request carries the same prompt: with sharing on (rule 16), lookups queued
    // or in flight at once would ride one RPC and a row would count lookups that never
    // went to the server.
    config.core.lookup_share = false;
    config
}

/// Checks every answer against the payload's hit.
struct Answers {
    expected: Probe,
    checked: u64,
    wrong: u64,
    example: Option<Probe>,
}

impl Answers {
    fn new(payload: &Payload) -> Self {
        Self {
            expected: Probe::Ready {
                external_tokens: payload.hit_tokens,
                load_async: true,
            },
            checked: 0,
            wrong: 0,
            example: None,
        }
    }

    fn check(&mut self, answer: Probe) {
        self.checked += 1;
        if answer != self.expected {
            self.wrong += 1;
            self.example = Some(answer);
        }
    }

    /// Fails when any answer was wrong, or when the client sent another number of
    /// RPCs than lookups (each lookup must be one RPC).
    fn finish(&self, client: &mut LookupClient, lookups: u64) -> anyhow::Result<()> {
        ensure!(
            self.wrong == 0,
            "{} of {} lookups answered {:?} instead of {:?}",
            self.wrong,
            self.checked,
            self.example,
            self.expected
        );
        let sent = client.stats().rpcs_sent;
        ensure!(sent == lookups, "{lookups} lookups went out as {sent} RPCs");
        Ok(())
    }
}

/// Sync loop (`lookup_async = false`, `max_in_flight` 1, as vLLM's REQ socket): each
/// lookup is `probe_until(Answer)` then `on_allocated`, one at a time. Returns lookups per
/// second over `count` lookups after `warmup` unmeasured ones.
///
/// # Errors
/// When the client cannot connect or an answer is wrong.
pub(crate) fn sync_loop(
    placement: Placement,
    endpoint: &Endpoint,
    payload: &Payload,
    warmup: usize,
    count: usize,
) -> anyhow::Result<f64> {
    let config = config(endpoint, payload, false, 0, 1);
    match placement {
        Placement::OneThread => {
            let runtime = super::peers::current_thread_runtime()?;
            runtime.block_on(async {
                let mut client = LookupClient::connect_lazy(config)?;
                let mut answers = Answers::new(payload);
                let mut start = Instant::now();
                for i in 0..warmup + count {
                    if i == warmup {
                        start = Instant::now();
                    }
                    let req = payload.request(i as u64);
                    answers.check(client.probe_until(&req, 0, Deadline::Answer).await);
                    client.on_allocated(req.request_id);
                }
                let elapsed = start.elapsed();
                answers.finish(&mut client, (warmup + count) as u64)?;
                client.shutdown().await;
                Ok(per_second(count, elapsed))
            })
        }
        Placement::TwoThreads => {
            let runtime = actor_runtime()?;
            let mut client = LookupClient::connect_lazy_with_handle(config, runtime.handle())?;
            let mut answers = Answers::new(payload);
            let mut start = Instant::now();
            for i in 0..warmup + count {
                if i == warmup {
                    start = Instant::now();
                }
                let req = payload.request(i as u64);
                answers.check(client.probe_until_blocking(&req, 0, Deadline::Answer)?);
                client.on_allocated(req.request_id);
            }
            let elapsed = start.elapsed();
            answers.finish(&mut client, (warmup + count) as u64)?;
            runtime.block_on(client.shutdown());
            Ok(per_second(count, elapsed))
        }
    }
}

/// Async prefetch loop (`lookup_async = true`): `batch` requests arrive at once
/// (`on_new_request` starts each lookup, `lookup_prefetch_limit` = `batch`), then each
/// is waited for with `probe_until(Answer)` and allocated; then the next batch. `max_in_flight`
/// RPCs go on the wire at once. Caller and actor share one current-thread runtime.
/// Returns lookups per second over `count` lookups after `warmup` unmeasured ones.
///
/// # Errors
/// When the client cannot connect or an answer is wrong.
pub(crate) fn batch_loop(
    endpoint: &Endpoint,
    payload: &Payload,
    max_in_flight: u32,
    batch: usize,
    warmup: usize,
    count: usize,
) -> anyhow::Result<f64> {
    let limit = u32::try_from(batch).context("batch above u32::MAX")?;
    let config = config(endpoint, payload, true, limit, max_in_flight);
    let runtime = super::peers::current_thread_runtime()?;
    runtime.block_on(async {
        let mut client = LookupClient::connect_lazy(config)?;
        let mut answers = Answers::new(payload);
        batches(&mut client, payload, &mut answers, 0, warmup, batch).await;
        let start = Instant::now();
        batches(&mut client, payload, &mut answers, warmup, count, batch).await;
        let elapsed = start.elapsed();
        answers.finish(&mut client, (warmup + count) as u64)?;
        client.shutdown().await;
        Ok(per_second(count, elapsed))
    })
}

/// Requests `first..first + count` in batches of `batch`: arrive together, then each
/// is waited for and allocated.
async fn batches(
    client: &mut LookupClient,
    payload: &Payload,
    answers: &mut Answers,
    first: usize,
    count: usize,
    batch: usize,
) {
    let mut next = first;
    let end = first + count;
    while next < end {
        let reqs: Vec<_> = (next..end.min(next + batch))
            .map(|i| payload.request(i as u64))
            .collect();
        next += reqs.len();
        for req in &reqs {
            client.on_new_request(req);
        }
        for req in &reqs {
            answers.check(client.probe_until(req, 0, Deadline::Answer).await);
            client.on_allocated(req.request_id);
        }
    }
}

/// Call costs of the caller-cost loop, by kind of call (ns).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProbeCosts {
    /// A request's first probe: submits its lookup (answers `Pending`).
    pub submit: Option<CallCost>,
    /// A later probe while the lookup is queued or in flight (`Pending`).
    pub pending: Option<CallCost>,
    /// The probe that first finds the answer (`Ready`).
    pub ready: Option<CallCost>,
    /// A probe of a request already answered: served from the result cache (rule 5).
    /// The Python design has none: its first read consumes the result.
    pub cached: Option<CallCost>,
    /// `submit`, `pending` and `ready` pooled: the calls both designs make.
    pub all: Option<CallCost>,
    /// Median time of an empty timed region (ns): included in every call, not
    /// subtracted.
    pub timer_ns: u64,
}

/// The caller-cost loop, shaped like the Python script's `--mode probe`: each step,
/// every request that arrived earlier is probed once (answered ones once more from
/// the cache, then allocated), `arrivals_per_step` new requests get their first probe,
/// and the caller waits `step` (the model's forward pass) while the actor works.
/// Async mode without prefetch, so a request's first probe submits its lookup as the
/// first `lookup(non_block=True)` call does; `max_in_flight` 1, as the Python
/// design's one worker.
///
/// # Errors
/// When the client cannot connect or an answer is wrong.
pub(crate) fn probe_cost(
    placement: Placement,
    endpoint: &Endpoint,
    payload: &Payload,
    warmup: usize,
    count: usize,
    arrivals_per_step: usize,
    step: Duration,
) -> anyhow::Result<ProbeCosts> {
    let config = config(endpoint, payload, true, 0, 1);
    match placement {
        Placement::OneThread => {
            let runtime = super::peers::current_thread_runtime()?;
            let mut client = LookupClient::connect_lazy_with_handle(config, runtime.handle())?;
            // The actor runs only while the caller waits in the runtime. The step ends
            // on a blocking-pool thread's sleep, not on a tokio timer, which would round
            // it up to whole milliseconds and make steps longer than the Python side's.
            let costs = probe_loop(
                &mut client,
                payload,
                warmup,
                count,
                arrivals_per_step,
                step,
                |client, until| {
                    runtime.block_on(async {
                        let rest = until.saturating_duration_since(Instant::now());
                        let step_over =
                            tokio::task::spawn_blocking(move || std::thread::sleep(rest));
                        tokio::pin!(step_over);
                        loop {
                            // `wait_progress` is cancel-safe: a report it was waiting for
                            // stays in the channel for the next call.
                            tokio::select! {
                                _ = &mut step_over => break,
                                () = client.wait_progress(Duration::from_secs(1)) => {}
                            }
                        }
                    });
                },
            );
            runtime.block_on(client.shutdown());
            costs
        }
        Placement::TwoThreads => {
            let runtime = actor_runtime()?;
            let mut client = LookupClient::connect_lazy_with_handle(config, runtime.handle())?;
            let costs = probe_loop(
                &mut client,
                payload,
                warmup,
                count,
                arrivals_per_step,
                step,
                |_, until| std::thread::sleep(until.saturating_duration_since(Instant::now())),
            );
            runtime.block_on(client.shutdown());
            costs
        }
    }
}

fn probe_loop(
    client: &mut LookupClient,
    payload: &Payload,
    warmup: usize,
    count: usize,
    arrivals_per_step: usize,
    step: Duration,
    mut wait: impl FnMut(&mut LookupClient, Instant),
) -> anyhow::Result<ProbeCosts> {
    ensure!(
        arrivals_per_step > 0,
        "arrivals per step must be at least 1"
    );
    let mut answers = Answers::new(payload);
    for i in 0..warmup {
        let req = payload.request(i as u64);
        let deadline = Instant::now() + super::peers::REPLY_TIMEOUT;
        loop {
            match client.probe(&req, 0) {
                Probe::Pending if Instant::now() < deadline => {
                    wait(client, Instant::now() + Duration::from_micros(50));
                }
                answer => {
                    answers.check(answer);
                    break;
                }
            }
        }
        client.on_allocated(req.request_id);
    }
    let timer_ns = timer_overhead_ns();
    let (mut submit, mut pending, mut ready, mut cached) = (vec![], vec![], vec![], vec![]);
    // Requests that arrived in an earlier step, and whether their answer is in.
    let mut waiting: Vec<(lookup_core::Request, bool)> = Vec::new();
    let mut next = warmup;
    let end = warmup + count;
    let mut done = 0;
    let steps = u32::try_from(count).unwrap_or(u32::MAX);
    let give_up = Instant::now() + super::peers::REPLY_TIMEOUT + step.saturating_mul(steps);
    while done < count {
        ensure!(
            Instant::now() < give_up,
            "the caller-cost loop made no progress"
        );
        let mut still = Vec::with_capacity(waiting.len());
        for (req, answered) in waiting.drain(..) {
            let t0 = Instant::now();
            let answer = client.probe(&req, 0);
            let took = nanos(t0.elapsed());
            if answered {
                cached.push(took);
                answers.check(answer);
                client.on_allocated(req.request_id);
                done += 1;
            } else if answer == Probe::Pending {
                pending.push(took);
                still.push((req, false));
            } else {
                ready.push(took);
                answers.check(answer);
                still.push((req, true));
            }
        }
        waiting = still;
        for _ in 0..arrivals_per_step {
            if next >= end {
                break;
            }
            let req = payload.request(next as u64);
            next += 1;
            let t0 = Instant::now();
            let answer = client.probe(&req, 0);
            submit.push(nanos(t0.elapsed()));
            let answered = answer != Probe::Pending;
            if answered {
                answers.check(answer);
            }
            waiting.push((req, answered));
        }
        wait(client, Instant::now() + step);
    }
    answers.finish(client, end as u64)?;
    let mut all: Vec<u64> = submit
        .iter()
        .chain(&pending)
        .chain(&ready)
        .copied()
        .collect();
    Ok(ProbeCosts {
        submit: CallCost::from_samples(&mut submit),
        pending: CallCost::from_samples(&mut pending),
        ready: CallCost::from_samples(&mut ready),
        cached: CallCost::from_samples(&mut cached),
        all: CallCost::from_samples(&mut all),
        timer_ns,
    })
}

/// A one-worker runtime for the actor when the caller has its own thread.
fn actor_runtime() -> anyhow::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot build a tokio runtime")
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Median time of an empty timed region: two back-to-back clock reads (ns).
fn timer_overhead_ns() -> u64 {
    let mut samples: Vec<u64> = (0..10_000)
        .map(|_| {
            let t0 = Instant::now();
            nanos(t0.elapsed())
        })
        .collect();
    CallCost::from_samples(&mut samples).map_or(0, |c| c.p50_ns)
}
