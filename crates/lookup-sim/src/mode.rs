//! The five lookup modes compared, as `lookup_core::Config`s.

use std::fmt;

use lookup_core::{Config, OnPreemption};

use super::budget::WaitBudget;

use super::trace::TRACE_BLOCK_TOKENS;

/// How the connector looks requests up.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum, serde::Serialize,
)]
pub enum Mode {
    /// vLLM's default (`lookup_async = false`): the probe blocks the engine thread
    /// until the RPC answers (`spec/behaviour.md` rule 10).
    #[value(name = "sync")]
    #[serde(rename = "sync")]
    Sync,
    /// vLLM #45659: the lookup starts at the first probe, which answers `Pending`; the
    /// request is retried on a later step. No prefetch, no priority, no sharing.
    #[value(name = "async")]
    #[serde(rename = "async")]
    Async,
    /// The prefetch follow-up (the seed behaviour): lookups start at arrival, bounded
    /// by `lookup_prefetch_limit`, results kept for `lookup_prefetch_ttl_s`.
    #[value(name = "prefetch")]
    #[serde(rename = "prefetch")]
    Prefetch,
    /// Prefetch plus this project's priority (rule 15) and shared lookups (rule 16).
    #[value(name = "prefetch+")]
    #[serde(rename = "prefetch+")]
    PrefetchPlus,
    /// `prefetch+`, and a probe answered `Pending` waits for its lookup (queued or on
    /// the wire) up to a budget on the engine thread before the request is deferred
    /// (by default the client's recent on-wire p90, within bounds:
    /// [`WaitBudget`]): a deferral costs a whole step (up
    /// to a 250 ms prefill chunk), the wait at most the budget.
    #[value(name = "prefetch+wait")]
    #[serde(rename = "prefetch+wait")]
    PrefetchWait,
}

impl Mode {
    /// All modes, in report order.
    pub const ALL: [Self; 5] = [
        Self::Sync,
        Self::Async,
        Self::Prefetch,
        Self::PrefetchPlus,
        Self::PrefetchWait,
    ];

    /// The name used on the command line and in reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Async => "async",
            Self::Prefetch => "prefetch",
            Self::PrefetchPlus => "prefetch+",
            Self::PrefetchWait => "prefetch+wait",
        }
    }

    /// The lookup configuration of this mode: block size 512 (the trace's), the given
    /// prefetch limit (prefetch modes only), TTL and timeout (seconds), and
    /// `max_in_flight` = the server's concurrency (1 for vLLM's REQ/REP socket).
    #[must_use]
    pub fn config(self, lookup: &LookupParams, max_in_flight: u32) -> Config {
        let mut c = Config::new(TRACE_BLOCK_TOKENS);
        // The command line checked both ([`seconds_arg`]); an unrepresentable value
        // keeps the default instead of panicking.
        if let Ok(ttl) = lookup_core::duration_from_secs(lookup.prefetch_ttl_s) {
            c.lookup_prefetch_ttl = ttl;
        }
        if let Ok(timeout) = lookup_core::duration_from_secs(lookup.timeout_s) {
            c.lookup_timeout = timeout;
        }
        c.max_in_flight = max_in_flight;
        c.lookup_on_preemption = lookup.on_preemption;
        if let Ok(wait) = lookup_core::duration_from_secs(lookup.preempted_wait_s) {
            c.lookup_preempted_wait = wait;
        }
        let (lookup_async, limit, ours) = match self {
            Self::Sync => (false, 0, false),
            Self::Async => (true, 0, false),
            Self::Prefetch => (true, lookup.prefetch_limit, false),
            Self::PrefetchPlus | Self::PrefetchWait => (true, lookup.prefetch_limit, true),
        };
        c.lookup_async = lookup_async;
        c.lookup_prefetch_limit = limit;
        c.lookup_priority = ours;
        c.lookup_share = ours;
        c
    }
}

/// A `--*-s` argument: finite seconds `>= 0` ([`lookup_core::duration_from_secs`]).
///
/// # Errors
/// A text naming what is wrong, for clap to print.
pub fn seconds_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|e| format!("{s:?} is not a number of seconds: {e}"))?;
    lookup_core::duration_from_secs(v)?;
    Ok(v)
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Lookup settings shared by the modes (`spec/behaviour.md`, configuration).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LookupParams {
    /// `lookup_prefetch_limit` of the prefetch modes: arrival-time lookups in flight
    /// at once. Default 32: bursts in the conversation trace reach 28 arrivals at one
    /// timestamp, and 32 lookups of ~1.3 ms keep the REP server's backlog under
    /// ~45 ms, well below one prefill step of a loaded engine.
    pub prefetch_limit: u32,
    /// `lookup_prefetch_ttl_s` (seconds). Default 2.0, the spec's default.
    pub prefetch_ttl_s: f64,
    /// `lookup_timeout_s` (seconds). Default 5.0, the spec's default.
    pub timeout_s: f64,
    /// `prefetch+wait`: longest the engine thread waits for a probe's lookup already
    /// queued or on the wire. Default: adaptive (the recent on-wire p90 within
    /// [0.5, 10] ms, [`WaitBudget::default`]).
    pub wait_budget: WaitBudget,
    /// `lookup_on_preemption` (`spec/behaviour.md` rule 8). Default the core's.
    #[serde(serialize_with = "policy_key")]
    pub on_preemption: OnPreemption,
    /// `lookup_preempted_wait_s` (seconds). Default the core's.
    pub preempted_wait_s: f64,
}

/// Serialises a `lookup_on_preemption` value by its key name.
///
/// # Errors
/// The serializer's.
pub fn policy_key<S: serde::Serializer>(p: &OnPreemption, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.as_key())
}

impl Default for LookupParams {
    fn default() -> Self {
        let core = Config::new(TRACE_BLOCK_TOKENS);
        Self {
            prefetch_limit: 32,
            prefetch_ttl_s: 2.0,
            timeout_s: 5.0,
            wait_budget: WaitBudget::default(),
            on_preemption: core.lookup_on_preemption,
            preempted_wait_s: core.lookup_preempted_wait.as_secs_f64(),
        }
    }
}

/// A `--on-preemption` argument: a `lookup_on_preemption` value.
///
/// # Errors
/// The core's message naming the accepted values.
pub fn policy_arg(s: &str) -> Result<OnPreemption, String> {
    OnPreemption::from_key(s).map_err(|e| e.to_string())
}
