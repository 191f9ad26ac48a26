//! Rate-limited warnings: each kind at most once per [`WARN_EVERY`], the first at once
//! (`spec/behaviour.md` rule 11: failures are logged once per kind), every one
//! counted in `lookup_warnings_total{kind}`, printed or not.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

/// A rate-limited warning of one kind is logged at most once per this interval.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(10);

/// Logs a warning of each kind at most once per [`WARN_EVERY`] (the first at once),
/// with the number of warnings of that kind suppressed since, so that a dead server
/// or a hostile peer cannot flood the log (CONTRIBUTING.md rule 11).
#[derive(Debug, Default)]
pub(crate) struct WarnLimiter {
    last: HashMap<&'static str, (Instant, u64)>,
    /// The `client` label of `lookup_warnings_total`, if known.
    label: Option<String>,
}

impl WarnLimiter {
    /// A limiter whose counter series carry `client = label`.
    pub(crate) fn labelled(label: &str) -> Self {
        Self {
            last: HashMap::new(),
            label: Some(label.to_owned()),
        }
    }

    /// Whether a warning of `kind` is due at `now`: `Some(suppressed since the last
    /// one)` when it is, `None` (and one more suppressed) when not.
    fn admit(&mut self, kind: &'static str, now: Instant) -> Option<u64> {
        match self.last.get_mut(kind) {
            Some((at, suppressed)) if now.saturating_duration_since(*at) < WARN_EVERY => {
                *suppressed += 1;
                None
            }
            Some((at, suppressed)) => {
                *at = now;
                Some(std::mem::take(suppressed))
            }
            None => {
                self.last.insert(kind, (now, 0));
                Some(0)
            }
        }
    }

    /// Logs `message` as a warning of `kind` if one is due at `now`.
    pub(crate) fn warn(&mut self, kind: &'static str, now: Instant, message: fmt::Arguments<'_>) {
        // Warnings are rare: a registry look-up per warning costs nothing that matters.
        match &self.label {
            Some(client) => {
                metrics::counter!("lookup_warnings_total", "client" => client.clone(), "kind" => kind)
                    .increment(1);
            }
            None => metrics::counter!("lookup_warnings_total", "kind" => kind).increment(1),
        }
        match self.admit(kind, now) {
            Some(0) => tracing::warn!(kind, "{message}"),
            Some(suppressed) => tracing::warn!(kind, suppressed, "{message}"),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first warning of a kind goes out at once; the next ones within
    /// [`WARN_EVERY`] are counted and reported with the next one due.
    #[test]
    fn warnings_are_rate_limited_per_kind() {
        let mut limiter = WarnLimiter::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(limiter.admit("timeout", t0), Some(0));
        assert_eq!(limiter.admit("timeout", t0 + ms(1)), None);
        assert_eq!(limiter.admit("timeout", t0 + ms(9_999)), None);
        // Another kind has its own budget.
        assert_eq!(limiter.admit("malformed", t0 + ms(2)), Some(0));
        assert_eq!(limiter.admit("timeout", t0 + WARN_EVERY), Some(2));
        assert_eq!(limiter.admit("timeout", t0 + WARN_EVERY + ms(1)), None);
        assert_eq!(limiter.admit("timeout", t0 + WARN_EVERY * 3), Some(1));
        assert_eq!(limiter.admit("malformed", t0 + WARN_EVERY * 3), Some(0));
    }
}
