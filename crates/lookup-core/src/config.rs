//! Configuration of the lookup lifecycle, with vLLM's key names and defaults.

use std::time::Duration;

use crate::Error;

/// Lookup configuration (`spec/behaviour.md`, "Configuration"). Key names are
/// vLLM's (`kv_connector_extra_config`); the fields marked *ours* go beyond vLLM.
///
/// Build with [`Config::new`] (which takes the one required key, `block_size`) and
/// adjust fields; [`Lookups::new`](crate::Lookups::new) validates it.
#[derive(Clone, Debug, PartialEq)]
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
    /// Seconds a completed result stays valid, measured from its reply; older results
    /// are looked up again at the next probe (rule 6). Default 2.0.
    pub lookup_prefetch_ttl_s: f64,
    /// *Ours*: seconds an RPC may stay unanswered after it was sent before it fails
    /// open with 0 hits (rule 17). Default 5.0.
    pub lookup_timeout_s: f64,
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
            lookup_prefetch_ttl_s: 2.0,
            lookup_timeout_s: 5.0,
            block_size,
            lookup_priority: true,
            lookup_share: true,
            max_in_flight: 1,
            max_queued: 65_536,
        }
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the key: `block_size` 0; a TTL that is negative,
    /// NaN or infinite; a timeout that is not a finite positive number; `max_in_flight`
    /// or `max_queued` 0.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |key: &'static str, why: String| Err(Error::InvalidConfig { key, why });
        if self.block_size == 0 {
            return bad("block_size", "must be at least 1 token".into());
        }
        if !self.lookup_prefetch_ttl_s.is_finite() || self.lookup_prefetch_ttl_s < 0.0 {
            return bad(
                "lookup_prefetch_ttl_s",
                format!(
                    "{} is not a finite number of seconds >= 0",
                    self.lookup_prefetch_ttl_s
                ),
            );
        }
        if !self.lookup_timeout_s.is_finite() || self.lookup_timeout_s <= 0.0 {
            return bad(
                "lookup_timeout_s",
                format!(
                    "{} is not a finite number of seconds > 0",
                    self.lookup_timeout_s
                ),
            );
        }
        if self.max_in_flight == 0 {
            return bad("max_in_flight", "must be at least 1".into());
        }
        if self.max_queued == 0 {
            return bad("max_queued", "must be at least 1".into());
        }
        Ok(())
    }

    /// True when lookups start at arrival: `enable_lookup`, `lookup_async` and a
    /// positive `lookup_prefetch_limit` all hold (`spec/behaviour.md`, configuration).
    #[must_use]
    pub fn prefetch_enabled(&self) -> bool {
        self.enable_lookup && self.lookup_async && self.lookup_prefetch_limit > 0
    }

    /// `lookup_prefetch_ttl_s` as a [`Duration`], saturating at [`Duration::MAX`] for
    /// values too large to represent (call after [`validate`](Self::validate)).
    #[must_use]
    pub fn ttl(&self) -> Duration {
        seconds(self.lookup_prefetch_ttl_s)
    }

    /// `lookup_timeout_s` as a [`Duration`], saturating at [`Duration::MAX`] for
    /// values too large to represent (call after [`validate`](Self::validate)).
    #[must_use]
    pub fn timeout(&self) -> Duration {
        seconds(self.lookup_timeout_s)
    }
}

/// Finite seconds >= 0 as a [`Duration`]; values beyond its range mean "never" and
/// saturate instead of panicking (a deadline built from one saturates too:
/// [`timer::deadline_after`](crate::timer::deadline_after)).
fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}
