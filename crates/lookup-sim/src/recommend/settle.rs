//! Which of the settings inside the noise of the best one to recommend
//! ([`settle`]): the cheapest to run, by [`Setting::cost`], among those the fresh
//! reruns cannot tell apart from the best and can tell apart from the cheapest
//! setting of all (sync); and which levers that leaves inside the noise.

use serde::Serialize;

use super::setting::Setting;
use crate::margin::paired;
use crate::mode::Mode;
use crate::stability::Verdict;

/// The recommended setting among those inside the noise of the best.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Settled {
    /// The setting to use.
    pub setting: Setting,
    /// The levers on which it differs from the best tried (`mode`, `server
    /// concurrency`, `prefetch limit`, `prefetch TTL`, `wait budget`): their values
    /// moved TTFT p99 by no more than the noise on the fresh reruns.
    pub inside_noise: Vec<&'static str>,
}

impl Setting {
    /// How much it costs to run, compared lexicographically (lower is cheaper):
    /// server concurrency first (each unit is one more REQ/REP connection and
    /// server worker), then the prefetch limit (lookups in flight or held per
    /// engine; 0 for modes that do not prefetch), the TTL (seconds an unused result
    /// is kept in memory; 0 for modes that do not prefetch), whether the engine
    /// waits for a lookup (a wait budget holds a scheduling step), and the mode, in
    /// the order sync, async, prefetch, prefetch+ (priority and shared lookups: more
    /// state), prefetch+wait.
    #[must_use]
    pub fn cost(&self) -> (u32, u32, f64, bool, u8) {
        let (limit, ttl) = if self.prefetches() {
            (self.prefetch_limit, self.ttl_s)
        } else {
            (0, 0.0)
        };
        let mode = match self.mode {
            Mode::Sync => 0,
            Mode::Async => 1,
            Mode::Prefetch => 2,
            Mode::PrefetchPlus => 3,
            Mode::PrefetchWait => 4,
        };
        (
            self.concurrency,
            limit,
            ttl,
            self.mode == Mode::PrefetchWait,
            mode,
        )
    }

    /// Whether `self` is cheaper to run than `other` ([`Self::cost`]).
    #[must_use]
    pub fn cheaper_than(&self, other: &Self) -> bool {
        self.cost().partial_cmp(&other.cost()) == Some(std::cmp::Ordering::Less)
    }

    /// The levers on which `self` and `other` differ (only those that matter to
    /// either's mode).
    #[must_use]
    pub fn levers_apart(&self, other: &Self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.mode != other.mode {
            out.push("mode");
        }
        if self.concurrency != other.concurrency {
            out.push("server concurrency");
        }
        let prefetch = self.prefetches() || other.prefetches();
        if prefetch && self.prefetch_limit != other.prefetch_limit {
            out.push("prefetch limit");
        }
        if prefetch && self.ttl_s.to_bits() != other.ttl_s.to_bits() {
            out.push("prefetch TTL");
        }
        let waits = self.mode == Mode::PrefetchWait && other.mode == Mode::PrefetchWait;
        if waits && self.wait_budget != other.wait_budget {
            out.push("wait budget");
        }
        out
    }

    /// The same mode at the cheapest value of each lever ([`Self::cost`]):
    /// concurrency 1 and, for a prefetching mode, prefetch limit 8 and TTL 1 s (the
    /// smallest the search tries, `stages`). Each searched mode's floor runs on the
    /// fresh reruns besides the best and the runner-up, so the cheap settings
    /// compared do not depend on which near equal the selection reruns picked.
    #[must_use]
    pub fn floor(&self) -> Self {
        let mut s = Self {
            concurrency: 1,
            ..*self
        };
        if self.prefetches() {
            s.prefetch_limit = 8;
            s.ttl_s = 1.0;
        }
        s
    }
}

/// The setting to recommend when `best` beats `cheapest` on the fresh reruns: the
/// cheapest by [`Setting::cost`] of `best` and those of `others` (each with its
/// fresh reruns, the same perturbations) that vLLM's connector follows, are stable
/// there, lie inside the noise of `best` (the paired interval of their p99 over
/// `best`'s holds 1) and beat `cheapest` by more than the noise (as
/// [`super::Decision::Better`] asks of `best`).
#[must_use]
pub fn settle(
    best: (&Setting, &Verdict),
    cheapest: &Verdict,
    others: &[(Setting, &Verdict)],
) -> Settled {
    let mut pick = *best.0;
    for (s, v) in others {
        let close = paired(best.1, v).is_some_and(|p| p.within_noise);
        let ahead = paired(v, cheapest).is_some_and(|p| !p.within_noise && p.median > 1.0);
        if s.vllm_follows() && v.stable && close && ahead && s.cheaper_than(&pick) {
            pick = *s;
        }
    }
    Settled {
        setting: pick,
        inside_noise: pick.levers_apart(best.0),
    }
}
