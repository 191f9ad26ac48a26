//! Configuration of the lookup lifecycle, with vLLM's key names and defaults.

use std::time::Duration;

use crate::Error;

/// Lookup configuration (`spec/behaviour.md`, "Configuration"). Key names are
/// vLLM's (`kv_connector_extra_config`); the fields marked *ours* go beyond vLLM.
///
/// Build with [`Config::new`] (which takes the one required key, `block_size`) and
/// adjust fields; [`Lookups::new`](crate::Lookups::new) validates it. Times are
/// [`Duration`]s; vLLM's float-second keys (`lookup_prefetch_ttl_s`,
/// `lookup_timeout_s`) are read into them by `lookup_tokio::ClientConfig`'s
/// `from_kv_connector_extra_config`. `#[non_exhaustive]`: later keys are additions.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// False: every probe answers `Ready(0)` and no RPC is ever sent. Default true.
    pub enable_lookup: bool,
    /// False (vLLM's default): the probe waits for the answer (sync mode; the driver
    /// blocks, the core answers `Pending` until the reply is in). Prefetch needs true.
    pub lookup_async: bool,
    /// Copied into [`Probe::Ready`](crate::Probe::Ready)'s `load_async` when there are
    /// external tokens to load. Default true.
    pub load_async: bool,
    /// Most arrival-time lookups (prefetches) in flight at once; 0 (the default)
    /// disables prefetch (`spec/behaviour.md` rules 2-3).
    pub lookup_prefetch_limit: u32,
    /// vLLM's `lookup_prefetch_ttl_s`: how long a completed result stays valid,
    /// measured from its reply; older results are looked up again at the next probe
    /// (rule 6). Zero: each result is read once. Default 2 s.
    pub lookup_prefetch_ttl: Duration,
    /// *Ours* (`lookup_timeout_s`): how long an RPC may stay unanswered after it was
    /// sent before it fails open with 0 hits (rule 17). A value beyond any deadline
    /// the clock can hold means "never" (deadlines saturate); zero fails each RPC as
    /// it is released (the key `lookup_timeout_s` must be positive: its reader
    /// refuses 0, `settings::Check::PositiveWhenRead`). Default 5 s.
    pub lookup_timeout: Duration,
    /// Lookup alignment in tokens, `B` (vLLM default 16; Mooncake traces 512). Required.
    pub block_size: u32,
    /// *Ours*: lookups a probe waits for go to the wire before queued prefetches, and a
    /// probe promotes its queued prefetch (rule 15). Default true.
    pub lookup_priority: bool,
    /// *Ours*: lookups of the same `(num_tokens, chain)` queued or in flight at once
    /// share one RPC (rule 16). Default true.
    pub lookup_share: bool,
    /// *Ours*: most lookup RPCs on the wire at once (vLLM: 1, a REQ socket). The
    /// driver's [`Dispatcher`](crate::Dispatcher) applies it. Default 1.
    pub max_in_flight: u32,
    /// *Ours*: most lookup RPCs waiting for the wire at once; arrival-time lookups
    /// beyond it are not submitted (the request is looked up at its probe instead) and
    /// counted in [`Stats::prefetch_backlog_full`](crate::Stats::prefetch_backlog_full).
    /// Probe lookups are never refused. Default 65,536.
    pub max_queued: u32,
    /// *Ours* (`max_pending_age_s`): how long a lookup RPC may wait for the wire
    /// (queued behind `max_in_flight` others) before it ends unsent, answering 0
    /// hits as unavailable (`Failed(NotSent)`), so that it never waits without bound
    /// behind a slow server nor takes the wire once stale (rule 17). The driver
    /// applies it. Must be positive. Default 5 s (vLLM's `lookup_timeout_s`).
    pub max_pending_age: Duration,
    /// *Ours* (`lookup_on_preemption`): what a preemption does to the request's lookup
    /// (`spec/behaviour.md` rule 8). Default [`OnPreemption::Discard`], vLLM's: on
    /// the engine model that admits a waiting request only when its whole prompt fits
    /// (vLLM's `scheduler_reserve_full_isl`), `cargo xtask simulate` finds no rerun
    /// of any mode collapsed with it, and `keep_wait` not told apart from it (rule 8
    /// gives the figures).
    pub lookup_on_preemption: OnPreemption,
    /// *Ours* (`lookup_preempted_wait_s`): with [`OnPreemption::Wait`] or
    /// [`OnPreemption::KeepWait`], how long the driver waits for a preempted request's
    /// probe before answering `Pending` ([`Lookups::wait_budget`](crate::Lookups::wait_budget),
    /// rule 8). Default 5 s (`lookup_timeout_s`: the lookup fails open by then).
    pub lookup_preempted_wait: Duration,
}

/// What a preemption does to the request's lookup (`lookup_on_preemption`,
/// `spec/behaviour.md` rule 8). vLLM's connector drops it; the other values keep it,
/// wait for it, or both, so that a preempted request is not overtaken by younger
/// ones while it waits for a new RPC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnPreemption {
    /// `discard` (vLLM): the lookup is dropped like at allocation; the request is
    /// looked up again when it is probed after the preemption.
    #[default]
    Discard,
    /// `keep`: the lookup stays (queued, in flight or done). A done result answers
    /// the request's later probes within its TTL (rule 6), also when its prompt grew
    /// by the tokens generated before the preemption (the new chain extends the one
    /// looked up: the stored prefix it reported is still a valid hit).
    Keep,
    /// `wait`: the lookup is dropped as with `discard`, and until the request is
    /// allocated again, a probe of it that would answer `Pending` waits up to
    /// `lookup_preempted_wait_s` for the answer instead ([`Lookups::wait_budget`](crate::Lookups::wait_budget)).
    Wait,
    /// `keep_wait`: both `keep` and `wait`.
    KeepWait,
}

impl OnPreemption {
    /// Every value, in the order of the spec's table.
    pub const ALL: [Self; 4] = [Self::Discard, Self::Keep, Self::Wait, Self::KeepWait];

    /// The value's name in `lookup_on_preemption`.
    #[must_use]
    pub fn as_key(self) -> &'static str {
        match self {
            Self::Discard => "discard",
            Self::Keep => "keep",
            Self::Wait => "wait",
            Self::KeepWait => "keep_wait",
        }
    }

    /// The value named `key` (`discard`, `keep`, `wait`, `keep_wait`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming `lookup_on_preemption` and the accepted values.
    pub fn from_key(key: &str) -> Result<Self, Error> {
        Self::ALL
            .into_iter()
            .find(|v| v.as_key() == key)
            .ok_or_else(|| Error::InvalidConfig {
                key: "lookup_on_preemption",
                why: format!("{key:?} is not one of discard, keep, wait, keep_wait"),
            })
    }

    /// The lookup stays across the preemption (`keep`, `keep_wait`).
    #[must_use]
    pub fn keeps(self) -> bool {
        matches!(self, Self::Keep | Self::KeepWait)
    }

    /// A preempted request's probe waits (`wait`, `keep_wait`).
    #[must_use]
    pub fn waits(self) -> bool {
        matches!(self, Self::Wait | Self::KeepWait)
    }
}

impl std::fmt::Display for OnPreemption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_key())
    }
}

impl std::str::FromStr for OnPreemption {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        Self::from_key(s)
    }
}

impl Config {
    /// The defaults of `spec/behaviour.md` with the given block size (tokens).
    #[must_use]
    pub fn new(block_size: u32) -> Self {
        Self {
            enable_lookup: true,
            lookup_async: false,
            load_async: true,
            lookup_prefetch_limit: 0,
            lookup_prefetch_ttl: Duration::from_secs(2),
            lookup_timeout: Duration::from_secs(5),
            block_size,
            lookup_priority: true,
            lookup_share: true,
            max_in_flight: 1,
            max_queued: 65_536,
            max_pending_age: Duration::from_secs(5),
            lookup_on_preemption: OnPreemption::Discard,
            lookup_preempted_wait: Duration::from_secs(5),
        }
    }

    /// Checks every field: `block_size`, then each of [`SETTINGS`](crate::settings::SETTINGS)
    /// by its [`Check`](crate::settings::Check), the one place a setting's validation
    /// is written.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the key: `block_size` 0; `max_in_flight` or
    /// `max_queued` 0; a zero `max_pending_age_s`. (A negative, NaN or infinite
    /// number of seconds cannot be a [`Duration`], and a `lookup_timeout_s` of 0 is
    /// a [`Config`]'s to hold: the reader of vLLM's keys rejects them, naming the
    /// key.)
    pub fn validate(&self) -> Result<(), Error> {
        if self.block_size == 0 {
            return Err(Error::InvalidConfig {
                key: "block_size",
                why: "must be at least 1 token".into(),
            });
        }
        crate::settings::SETTINGS
            .iter()
            .try_for_each(|s| s.validate(self))
    }

    /// True when lookups start at arrival: `enable_lookup`, `lookup_async` and a
    /// positive `lookup_prefetch_limit` all hold (`spec/behaviour.md`, configuration).
    #[must_use]
    pub fn prefetch_enabled(&self) -> bool {
        self.enable_lookup && self.lookup_async && self.lookup_prefetch_limit > 0
    }

    /// [`lookup_prefetch_ttl`](Self::lookup_prefetch_ttl).
    #[must_use]
    pub fn ttl(&self) -> Duration {
        self.lookup_prefetch_ttl
    }

    /// [`lookup_timeout`](Self::lookup_timeout).
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.lookup_timeout
    }
}

/// Seconds as a [`Duration`], as vLLM's float-second keys give them: finite and
/// `>= 0`; values beyond a [`Duration`]'s range mean "never" and saturate at
/// [`Duration::MAX`] instead of panicking (a deadline built from one saturates too:
/// [`timer::deadline_after`](crate::timer::deadline_after)).
///
/// # Errors
/// A text saying what is wrong (for the caller to name the key): a negative, NaN or
/// infinite number.
pub fn duration_from_secs(s: f64) -> Result<Duration, String> {
    if s.is_nan() || s.is_infinite() || s < 0.0 {
        return Err(format!("{s} is not a finite number of seconds >= 0"));
    }
    Ok(Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_on_preemption_reads_its_four_names_and_rejects_others() {
        let names: Vec<&str> = OnPreemption::ALL.iter().map(|v| v.as_key()).collect();
        assert_eq!(names, ["discard", "keep", "wait", "keep_wait"]);
        for v in OnPreemption::ALL {
            assert_eq!(v.as_key().parse::<OnPreemption>().unwrap(), v);
        }
        let err = OnPreemption::from_key("Keep").unwrap_err();
        assert_eq!(
            err.to_string(),
            Error::InvalidConfig {
                key: "lookup_on_preemption",
                why: "\"Keep\" is not one of discard, keep, wait, keep_wait".into(),
            }
            .to_string()
        );
        let keeps: Vec<bool> = OnPreemption::ALL.iter().map(|v| v.keeps()).collect();
        let waits: Vec<bool> = OnPreemption::ALL.iter().map(|v| v.waits()).collect();
        assert_eq!(keeps, [false, true, false, true]);
        assert_eq!(waits, [false, false, true, true]);
    }

    #[test]
    fn the_default_preemption_policy_is_the_spec_table_s() {
        let c = Config::new(16);
        assert_eq!(c.lookup_on_preemption, OnPreemption::Discard);
        assert_eq!(OnPreemption::default(), OnPreemption::Discard);
        assert_eq!(c.lookup_preempted_wait, Duration::from_secs(5));
    }
}
