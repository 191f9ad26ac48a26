//! The ground truth of a chaos run and the judge of every answer against it.
//!
//! [`Truth`] is what the store held over time: for each key, the spans from the put
//! that stored it (the time its put was sent, the earliest it can be seen) to the
//! event that ended it (the time that event was over, the latest it can still be
//! seen), and how it ended ([`Loss`]). [`Truth::judge`] says whether a claim "the
//! store holds this key" made at a time was right, given [`Bounds`]. Pure: times are
//! offsets from the run's start, nothing here reads a clock.

use std::collections::HashMap;
use std::time::Duration;

/// How a key left the store; it sets how long a claim on it may still be right.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Loss {
    /// Removed behind the client's back while its connection stayed up: a forced
    /// remove, or a `RemoveAll` by another client. The presence cache trusts a
    /// positive answer for the master's read lease, and a completed result is reused
    /// for the client's result TTL (`spec/mooncake-master-rpc.md`, "Where the lease
    /// can be read"; `spec/behaviour.md` rule 6): [`Bounds::removed`].
    Removed,
    /// Gone with the master that held it: a master restart, a leader killed, a leader
    /// deposed while etcd was down. The connection that answered ended, and the
    /// presence cache and the lease belong to that connection: only a result already
    /// completed may still be reused for its TTL: [`Bounds::lost`].
    Lost,
}

/// How long after a key left the store a claim on it is still allowed, per [`Loss`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Bounds {
    /// [`Loss::Removed`]: read lease plus result TTL.
    pub removed: Duration,
    /// [`Loss::Lost`]: result TTL.
    pub lost: Duration,
}

impl Bounds {
    /// The bounds of a store with read lease `lease` whose clients reuse results for
    /// `ttl`, each widened by `slack` (the time a loss takes to reach the clients'
    /// sockets and the judge's own view of it).
    #[must_use]
    pub fn new(lease: Duration, ttl: Duration, slack: Duration) -> Self {
        Self {
            removed: lease + ttl + slack,
            lost: ttl + slack,
        }
    }

    /// The bound of `loss`.
    #[must_use]
    pub fn of(&self, loss: Loss) -> Duration {
        match loss {
            Loss::Removed => self.removed,
            Loss::Lost => self.lost,
        }
    }
}

/// One stay of a key in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    /// When the put that stored it was sent.
    from: Duration,
    /// When the event that ended it was over, and what it was; `None` while held.
    until: Option<(Duration, Loss)>,
}

/// The judge's verdict on one claim that the store holds a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The store held the key then (or its put was under way).
    Held,
    /// The key had left the store, within the bound of how it left.
    WithinBound,
    /// Wrong: the key had left the store longer ago than the bound of how it left
    /// allows, or had never been stored before the claim.
    Wrong {
        /// Time since the key left the store; `None` when it was never stored before
        /// the claim.
        since: Option<Duration>,
    },
}

/// What the store held over a run, key by key.
#[derive(Clone, Debug, Default)]
pub struct Truth {
    keys: HashMap<String, Vec<Span>>,
}

impl Truth {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// `keys` were put, the put sent at `at`. A key already held stays in its span.
    pub fn put<K: AsRef<str>>(&mut self, keys: &[K], at: Duration) {
        for key in keys {
            let spans = self.keys.entry(key.as_ref().to_owned()).or_default();
            if spans.last().is_none_or(|s| s.until.is_some()) {
                spans.push(Span {
                    from: at,
                    until: None,
                });
            }
        }
    }

    /// `keys` left the store by `loss`, the event over at `at`. A key not held is
    /// left as it is.
    pub fn remove<K: AsRef<str>>(&mut self, keys: &[K], at: Duration, loss: Loss) {
        for key in keys {
            if let Some(span) = self
                .keys
                .get_mut(key.as_ref())
                .and_then(|spans| spans.last_mut())
                .filter(|s| s.until.is_none())
            {
                span.until = Some((at, loss));
            }
        }
    }

    /// Every key held left the store by `loss`, the event over at `at` (a wipe, a
    /// master gone).
    pub fn remove_all(&mut self, at: Duration, loss: Loss) {
        for span in self.keys.values_mut().filter_map(|spans| spans.last_mut()) {
            if span.until.is_none() {
                span.until = Some((at, loss));
            }
        }
    }

    /// Whether `key` is held now (after every event recorded so far).
    #[must_use]
    pub fn held(&self, key: &str) -> bool {
        self.keys
            .get(key)
            .and_then(|spans| spans.last())
            .is_some_and(|s| s.until.is_none())
    }

    /// The keys held now, sorted.
    #[must_use]
    pub fn held_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.keys.keys().filter(|k| self.held(k)).cloned().collect();
        keys.sort();
        keys
    }

    /// The verdict on a claim, made at `at`, that the store holds `key`: right while
    /// a span of the key covers `at` (its put sent at or before `at`), or ended no
    /// longer ago than the bound of its [`Loss`]; else wrong.
    #[must_use]
    pub fn judge(&self, key: &str, at: Duration, bounds: &Bounds) -> Verdict {
        let mut since: Option<Duration> = None;
        for span in self.keys.get(key).into_iter().flatten() {
            if span.from > at {
                continue;
            }
            match span.until {
                None => return Verdict::Held,
                Some((until, _)) if until >= at => return Verdict::Held,
                Some((until, loss)) => {
                    let ago = at - until;
                    if ago <= bounds.of(loss) {
                        return Verdict::WithinBound;
                    }
                    since = Some(since.map_or(ago, |s| s.min(ago)));
                }
            }
        }
        Verdict::Wrong { since }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Lease 2 s, TTL 1 s, no slack: removed 3 s, lost 1 s.
    fn bounds() -> Bounds {
        Bounds::new(ms(2_000), ms(1_000), Duration::ZERO)
    }

    #[test]
    fn bounds_add_lease_ttl_and_slack() {
        let b = Bounds::new(ms(2_000), ms(1_000), ms(100));
        assert_eq!(b.removed, ms(3_100));
        assert_eq!(b.lost, ms(1_100));
        assert_eq!(b.of(Loss::Removed), ms(3_100));
        assert_eq!(b.of(Loss::Lost), ms(1_100));
    }

    #[test]
    fn a_removed_key_is_wrong_iff_the_claim_comes_past_the_bound() {
        let mut truth = Truth::new();
        truth.put(&["k"], ms(1_000));
        truth.remove(&["k"], ms(5_000), Loss::Removed);
        let b = bounds();
        assert_eq!(truth.judge("k", ms(4_999), &b), Verdict::Held);
        assert_eq!(truth.judge("k", ms(5_000), &b), Verdict::Held);
        assert_eq!(truth.judge("k", ms(5_001), &b), Verdict::WithinBound);
        // t - t0 = 3,000 ms = the bound: still right.
        assert_eq!(truth.judge("k", ms(8_000), &b), Verdict::WithinBound);
        // t - t0 = 3,001 ms > the bound: wrong, 3,001 ms after the removal.
        assert_eq!(
            truth.judge("k", ms(8_001), &b),
            Verdict::Wrong {
                since: Some(ms(3_001))
            }
        );
    }

    #[test]
    fn a_lost_key_has_only_the_ttl() {
        let mut truth = Truth::new();
        truth.put(&["a", "b"], ms(0));
        truth.remove_all(ms(2_000), Loss::Lost);
        let b = bounds();
        assert_eq!(truth.judge("a", ms(3_000), &b), Verdict::WithinBound);
        assert_eq!(
            truth.judge("b", ms(3_001), &b),
            Verdict::Wrong {
                since: Some(ms(1_001))
            }
        );
        assert!(!truth.held("a"));
        assert_eq!(truth.held_keys(), Vec::<String>::new());
    }

    #[test]
    fn a_key_never_put_or_put_after_the_claim_is_wrong() {
        let mut truth = Truth::new();
        truth.put(&["late"], ms(10_000));
        let b = bounds();
        assert_eq!(
            truth.judge("never", ms(1), &b),
            Verdict::Wrong { since: None }
        );
        assert_eq!(
            truth.judge("late", ms(9_999), &b),
            Verdict::Wrong { since: None }
        );
        assert_eq!(truth.judge("late", ms(10_000), &b), Verdict::Held);
    }

    #[test]
    fn a_key_put_again_is_held_in_its_new_span() {
        let mut truth = Truth::new();
        truth.put(&["k"], ms(0));
        truth.remove(&["k"], ms(1_000), Loss::Lost);
        truth.put(&["k"], ms(6_000));
        let b = bounds();
        // Between the spans: past the first span's bound, before the second put.
        assert_eq!(
            truth.judge("k", ms(5_000), &b),
            Verdict::Wrong {
                since: Some(ms(4_000))
            }
        );
        assert_eq!(truth.judge("k", ms(6_500), &b), Verdict::Held);
        assert!(truth.held("k"));
        assert_eq!(truth.held_keys(), vec!["k".to_owned()]);
    }

    #[test]
    fn a_put_of_a_held_key_keeps_its_span_and_a_remove_of_an_absent_key_is_a_no_op() {
        let mut truth = Truth::new();
        truth.put(&["k"], ms(0));
        truth.put(&["k"], ms(5_000));
        truth.remove(&["absent"], ms(100), Loss::Removed);
        truth.remove(&["k"], ms(6_000), Loss::Removed);
        truth.remove(&["k"], ms(7_000), Loss::Lost);
        let b = bounds();
        // Held from 0 (the first put), ended at 6,000 as removed (the second event
        // found nothing held): 9,000 is within 3 s, 9,001 past it.
        assert_eq!(truth.judge("k", ms(1), &b), Verdict::Held);
        assert_eq!(truth.judge("k", ms(9_000), &b), Verdict::WithinBound);
        assert_eq!(
            truth.judge("k", ms(9_001), &b),
            Verdict::Wrong {
                since: Some(ms(3_001))
            }
        );
        assert_eq!(
            truth.judge("absent", ms(200), &b),
            Verdict::Wrong { since: None }
        );
    }
}
