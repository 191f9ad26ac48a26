//! The counters the model predicts exactly, and how they are read from the core.

use lookup_core::{DispatcherStats, Stats};

/// Counters the model predicts exactly: the names of [`lookup_core::Stats`] and, for
/// the wire's, of [`lookup_core::DispatcherStats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) lookups_arrival: u64,
    pub(crate) lookups_probe: u64,
    pub(crate) prefetch_ineligible: u64,
    pub(crate) prefetch_cap_full: u64,
    pub(crate) prefetch_backlog_full: u64,
    pub(crate) rpcs_created: u64,
    pub(crate) rpcs_shared: u64,
    pub(crate) rpcs_cancelled: u64,
    pub(crate) replies_stale: u64,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    pub(crate) failed_timed_out: u64,
    pub(crate) failed_malformed: u64,
    pub(crate) failed_transport: u64,
    pub(crate) failed_store_unavailable: u64,
    pub(crate) ttl_refreshes: u64,
    pub(crate) chain_refreshes: u64,
    pub(crate) promotions: u64,
    pub(crate) demotions: u64,
    pub(crate) probes_pending: u64,
    pub(crate) probes_ready: u64,
    pub(crate) answers_hit: u64,
    pub(crate) answers_miss: u64,
    pub(crate) answers_not_needed: u64,
    pub(crate) answers_unavailable: u64,
    pub(crate) retries_after_failure: u64,
    /// First probes answered `Ready`, of requests eligible (rule 1) when the core
    /// first recorded them.
    pub(crate) first_probes_ready: u64,
    /// First probes answered `Pending`, likewise.
    pub(crate) first_probes_pending: u64,
    pub(crate) resets: u64,
    /// Preemptions that kept a lookup (rule 8, `keep` and `keep_wait`).
    pub(crate) lookups_kept_on_preemption: u64,
    pub(crate) events_dropped: u64,
    /// The dispatcher's: RPCs released to the wire.
    pub(crate) rpcs_sent: u64,
    /// The dispatcher's: replies for RPCs not on the wire.
    pub(crate) late_replies: u64,
    /// The dispatcher's: RPCs that timed out on the wire.
    pub(crate) rpcs_timed_out: u64,
    /// The dispatcher's: RPCs on the wire failed by the transport.
    pub(crate) rpcs_failed_transport: u64,
}

impl Counters {
    /// The counters the core and its dispatcher report.
    pub(crate) fn of(s: &Stats, d: &DispatcherStats) -> Self {
        Self {
            lookups_arrival: s.lookups_arrival,
            lookups_probe: s.lookups_probe,
            prefetch_ineligible: s.prefetch_ineligible,
            prefetch_cap_full: s.prefetch_cap_full,
            prefetch_backlog_full: s.prefetch_backlog_full,
            rpcs_created: s.rpcs_created,
            rpcs_shared: s.rpcs_shared,
            rpcs_cancelled: s.rpcs_cancelled,
            replies_stale: s.replies_stale,
            hits: s.hits,
            misses: s.misses,
            failed_timed_out: s.failed_timed_out,
            failed_malformed: s.failed_malformed,
            failed_transport: s.failed_transport,
            failed_store_unavailable: s.failed_store_unavailable,
            ttl_refreshes: s.ttl_refreshes,
            chain_refreshes: s.chain_refreshes,
            promotions: s.promotions,
            demotions: s.demotions,
            probes_pending: s.probes_pending,
            probes_ready: s.probes_ready,
            answers_hit: s.answers_hit,
            answers_miss: s.answers_miss,
            answers_not_needed: s.answers_not_needed,
            answers_unavailable: s.answers_unavailable,
            retries_after_failure: s.retries_after_failure,
            first_probes_ready: s.first_probes_ready,
            first_probes_pending: s.first_probes_pending,
            resets: s.resets,
            lookups_kept_on_preemption: s.lookups_kept_on_preemption,
            events_dropped: s.events_dropped,
            rpcs_sent: d.rpcs_sent,
            late_replies: d.late_replies,
            rpcs_timed_out: d.rpcs_timed_out,
            rpcs_failed_transport: d.rpcs_failed_transport,
        }
    }

    /// Every counter with its name, for the never-backwards check.
    pub(crate) fn named(&self) -> [(&'static str, u64); 35] {
        [
            ("lookups_arrival", self.lookups_arrival),
            ("lookups_probe", self.lookups_probe),
            ("prefetch_ineligible", self.prefetch_ineligible),
            ("prefetch_cap_full", self.prefetch_cap_full),
            ("prefetch_backlog_full", self.prefetch_backlog_full),
            ("rpcs_created", self.rpcs_created),
            ("rpcs_shared", self.rpcs_shared),
            ("rpcs_cancelled", self.rpcs_cancelled),
            ("replies_stale", self.replies_stale),
            ("hits", self.hits),
            ("misses", self.misses),
            ("failed_timed_out", self.failed_timed_out),
            ("failed_malformed", self.failed_malformed),
            ("failed_transport", self.failed_transport),
            ("failed_store_unavailable", self.failed_store_unavailable),
            ("ttl_refreshes", self.ttl_refreshes),
            ("chain_refreshes", self.chain_refreshes),
            ("promotions", self.promotions),
            ("demotions", self.demotions),
            ("probes_pending", self.probes_pending),
            ("probes_ready", self.probes_ready),
            ("answers_hit", self.answers_hit),
            ("answers_miss", self.answers_miss),
            ("answers_not_needed", self.answers_not_needed),
            ("answers_unavailable", self.answers_unavailable),
            ("retries_after_failure", self.retries_after_failure),
            ("first_probes_ready", self.first_probes_ready),
            ("first_probes_pending", self.first_probes_pending),
            ("resets", self.resets),
            (
                "lookups_kept_on_preemption",
                self.lookups_kept_on_preemption,
            ),
            ("events_dropped", self.events_dropped),
            ("rpcs_sent", self.rpcs_sent),
            ("late_replies", self.late_replies),
            ("rpcs_timed_out", self.rpcs_timed_out),
            ("rpcs_failed_transport", self.rpcs_failed_transport),
        ]
    }
}
