//! What the recommendation chooses among ([`Setting`]: only what an operator sets for
//! lookups) and a setting with how its reruns went ([`Scored`]), ranked by the p99 it
//! can be counted on.

use std::fmt::Write as _;

use lookup_core::OnPreemption;
use serde::Serialize;

use crate::budget::WaitBudget;
use crate::engine::SimParams;
use crate::mode::Mode;
use crate::stability::Verdict;

/// The lookup settings an operator chooses: vLLM's `lookup_async` and the
/// prefetching modes (`mode`), `lookup_prefetch_limit`, `lookup_prefetch_ttl_s`, the
/// wait budget, `lookup_on_preemption` and the lookup server's concurrency. The
/// engine's own settings (KV capacity, `max_num_seqs`, what a `Pending` probe does to
/// the waiting loop) are not among them: they are the run's, and what other values
/// would buy is reported apart ([`super::Lever`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Setting {
    /// The lookup mode.
    pub mode: Mode,
    /// Lookup server concurrency (and the client's `max_in_flight`).
    pub concurrency: u32,
    /// `lookup_prefetch_limit` (prefetch modes).
    pub prefetch_limit: u32,
    /// `lookup_prefetch_ttl_s` (seconds).
    pub ttl_s: f64,
    /// `prefetch+wait`'s wait budget.
    pub wait_budget: WaitBudget,
    /// `lookup_on_preemption` (`spec/behaviour.md` rule 8).
    #[serde(serialize_with = "crate::mode::policy_key")]
    pub on_preemption: OnPreemption,
}

impl Setting {
    /// The setting of `mode` in `params`.
    #[must_use]
    pub fn of(mode: Mode, params: &SimParams) -> Self {
        Self {
            mode,
            concurrency: params.server.concurrency,
            prefetch_limit: params.lookup.prefetch_limit,
            ttl_s: params.lookup.prefetch_ttl_s,
            wait_budget: params.lookup.wait_budget,
            on_preemption: params.lookup.on_preemption,
        }
    }

    /// The cheapest setting to run: vLLM's own, a synchronous lookup (no prefetch,
    /// no wait budget) over one REQ/REP pair (concurrency 1), with vLLM's
    /// `lookup_on_preemption = discard` (nothing held across a preemption). What is
    /// recommended when no setting is told apart from it.
    #[must_use]
    pub fn cheapest(params: &SimParams) -> Self {
        Self {
            mode: Mode::Sync,
            concurrency: 1,
            on_preemption: OnPreemption::Discard,
            ..Self::of(Mode::Sync, params)
        }
    }

    /// `base` with this setting.
    #[must_use]
    pub fn apply(&self, base: &SimParams) -> SimParams {
        let mut p = base.clone();
        p.server.concurrency = self.concurrency;
        p.lookup.prefetch_limit = self.prefetch_limit;
        p.lookup.prefetch_ttl_s = self.ttl_s;
        p.lookup.wait_budget = self.wait_budget;
        p.lookup.on_preemption = self.on_preemption;
        p
    }

    /// Whether vLLM 0.33's connector with this project's client
    /// (`python/mooncake_lookup`, `prefetch_extra_config`) follows it: the drop-in
    /// reads each answer once, as vLLM's client does, so it refuses a
    /// `lookup_on_preemption` that keeps or waits for a preempted request's lookup.
    /// Only such settings are recommended; `keep_wait`'s effect is reported apart.
    #[must_use]
    pub fn vllm_follows(&self) -> bool {
        self.on_preemption == OnPreemption::Discard
    }

    /// Whether the mode prefetches (so the prefetch limit and TTL matter).
    #[must_use]
    pub fn prefetches(&self) -> bool {
        matches!(
            self.mode,
            Mode::Prefetch | Mode::PrefetchPlus | Mode::PrefetchWait
        )
    }

    /// In words, with only what matters to its mode.
    #[must_use]
    pub fn describe(&self) -> String {
        let mut out = format!("{}, server concurrency {}", self.mode, self.concurrency);
        if self.prefetches() {
            let _ = write!(
                out,
                ", prefetch limit {}, TTL {} s",
                self.prefetch_limit, self.ttl_s
            );
        }
        if self.mode == Mode::PrefetchWait {
            let _ = write!(out, ", wait budget {}", self.wait_budget);
        }
        let _ = write!(out, ", on preemption {}", self.on_preemption);
        out
    }
}

/// A setting and how its reruns went.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Scored {
    /// The setting.
    pub setting: Setting,
    /// Its reruns' verdict (over its screening runs only when `screened_out`).
    pub verdict: Verdict,
    /// A screening run's p99 was already above the p99 it had to beat, so it was not
    /// rerun further: its stable p99 can only be higher (the largest of its reruns).
    pub screened_out: bool,
}

impl Scored {
    /// The p99 it can be counted on: the largest of its reruns (ms).
    #[must_use]
    pub fn stable_p99_ms(&self) -> f64 {
        self.verdict.p99_ms.max
    }

    /// Rerun, stable and healthy in every rerun, and a setting vLLM's connector
    /// follows ([`Setting::vllm_follows`]).
    #[must_use]
    pub fn eligible(&self) -> bool {
        self.verdict.stable && !self.screened_out && self.setting.vllm_follows()
    }

    /// Ranks before `other`: eligible first, then the lower stable p99, then the
    /// lower worst p50.
    #[must_use]
    pub fn better_than(&self, other: &Self) -> bool {
        match (self.eligible(), other.eligible()) {
            (true, false) => true,
            (false, true) => false,
            _ => {
                (self.stable_p99_ms(), self.verdict.p50_ms.max)
                    < (other.stable_p99_ms(), other.verdict.p50_ms.max)
            }
        }
    }
}

/// The best of `tried` satisfying `pred` (eligible first).
pub(crate) fn best_of<'a>(
    tried: &'a [Scored],
    pred: &dyn Fn(&Scored) -> bool,
) -> Option<&'a Scored> {
    tried
        .iter()
        .filter(|t| pred(t))
        .fold(None::<&Scored>, |acc, t| match acc {
            Some(a) if !t.better_than(a) => Some(a),
            _ => Some(t),
        })
}
