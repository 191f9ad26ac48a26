//! What the search found ([`Recommendation`]): the decision and the setting to use,
//! its margins on the fresh reruns, what the capacity levers would buy, and why each
//! other mode lost.

use serde::Serialize;

use super::capacity::Lever;
use super::setting::{Scored, Setting};
use crate::margin::{Paired, paired};
use crate::mechanism::Mechanism;
use crate::stability::Verdict;

/// What the recommendation says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    /// The best setting on the selection reruns beats the cheapest one on the fresh
    /// reruns by more than the noise (the paired interval lies above 1): use it.
    Better,
    /// No lookup setting is told apart from the cheapest on the fresh reruns (the
    /// paired interval of the best one holds 1, or it is not ahead at the median):
    /// use the cheapest.
    Indistinguishable,
    /// The cheapest setting is itself the best on the selection reruns.
    CheapestIsBest,
    /// The best setting on the selection reruns is unstable or unhealthy on the
    /// fresh ones: its pick does not hold; use the cheapest.
    NotConfirmed,
    /// No setting tried is stable and healthy on the selection reruns.
    NoneStable,
}

/// A setting's fresh reruns.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Confirmed {
    /// The setting.
    pub setting: Setting,
    /// Its verdict over the fresh reruns.
    pub verdict: Verdict,
}

/// One margin of the recommended setting on the fresh reruns.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Margin {
    /// `cheapest` (vLLM's own synchronous setting), `best tried` (when another is
    /// recommended, [`super::settle`]) or `runner-up` (the best setting
    /// of another mode than the pick's).
    pub against: &'static str,
    /// That setting.
    pub setting: Setting,
    /// Its p99 over the pick's, rerun by rerun on the fresh reruns (`None`: not
    /// paired).
    pub ratio: Option<Paired>,
}

/// Why a mode lost: its best setting tried and the mechanism.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Loss {
    /// The mode's best setting tried.
    pub setting: Setting,
    /// The mechanism, from its selection runs' counters against the pick's.
    pub mechanism: Mechanism,
    /// The mechanism in words.
    pub text: String,
}

/// The outcome of the search.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recommendation {
    /// What it says.
    pub decision: Decision,
    /// The setting to use (`None` with [`Decision::NoneStable`]).
    pub recommended: Option<Setting>,
    /// With [`Decision::Better`]: the levers on which `recommended` differs from
    /// the best tried, inside the noise of it on the fresh reruns
    /// ([`super::settle`]); empty when the best tried is recommended.
    pub inside_noise: Vec<&'static str>,
    /// The best stable, healthy setting on the selection reruns.
    pub best: Option<Scored>,
    /// The best stable, healthy setting of another mode than `best`'s.
    pub runner_up: Option<Scored>,
    /// vLLM's own synchronous setting ([`Setting::cheapest`]).
    pub cheapest: Setting,
    /// Selection reruns: `0..repeats`.
    pub repeats: u32,
    /// The fresh reruns (`repeats..2 * repeats`) of the best, the runner-up, the
    /// best's lever floor ([`Setting::floor`]) and the cheapest setting.
    pub confirmed: Vec<Confirmed>,
    /// The pick against the cheapest setting and the runner-up, on the fresh reruns.
    pub margins: Vec<Margin>,
    /// What the engine's capacity levers buy at the recommended setting, on the
    /// fresh reruns.
    pub capacity: Vec<Lever>,
    /// The recommended setting with `lookup_on_preemption = keep_wait` (which
    /// vLLM's connector does not follow), on the fresh reruns.
    pub keep_wait: Option<Lever>,
    /// Each other mode searched, at its best setting, and why it lost.
    pub losses: Vec<Loss>,
    /// Every setting tried on the selection reruns, in the order tried.
    pub tried: Vec<Scored>,
    /// Simulations run.
    pub runs: usize,
}

impl Recommendation {
    /// The fresh reruns of `s`, when it ran them.
    #[must_use]
    pub fn fresh(&self, s: &Setting) -> Option<&Verdict> {
        self.confirmed
            .iter()
            .find(|c| c.setting == *s)
            .map(|c| &c.verdict)
    }
}

impl Decision {
    /// The decision from the selection's best setting (`None`: none stable and
    /// healthy), the cheapest setting, and their fresh reruns (the same
    /// perturbations): [`Self::Better`] only when the cheapest's p99 over the
    /// best's, paired rerun by rerun, has its 95 % interval above 1.
    #[must_use]
    pub fn of(
        best: Option<&Setting>,
        cheapest: &Setting,
        best_fresh: Option<&Verdict>,
        cheapest_fresh: Option<&Verdict>,
    ) -> Self {
        match (best, best_fresh, cheapest_fresh) {
            (None, _, _) => Self::NoneStable,
            (Some(b), _, _) if b == cheapest => Self::CheapestIsBest,
            (Some(_), Some(v), Some(c)) if v.stable => match paired(v, c) {
                Some(p) if !p.within_noise && p.median > 1.0 => Self::Better,
                _ => Self::Indistinguishable,
            },
            _ => Self::NotConfirmed,
        }
    }

    /// The setting to use before [`super::settle`]: `best` when [`Self::Better`], none when
    /// [`Self::NoneStable`], the cheapest otherwise.
    #[must_use]
    pub fn pick(self, best: Option<&Setting>, cheapest: &Setting) -> Option<Setting> {
        match self {
            Self::Better => best.copied(),
            Self::NoneStable => None,
            _ => Some(*cheapest),
        }
    }
}
