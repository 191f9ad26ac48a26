//! The queue over time of a fidelity run: the engines' samples (one a second) summed
//! per second, their time averages, and the side-by-side table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::Side;
use crate::simulate::engine::Sample;

/// A second of a series: `(t_s, waiting, running, kv_held)`, each summed over the
/// engines.
pub(super) type Total = (u64, u64, u64, u64);

/// Waiting requests, running requests and KV blocks held, each summed over the
/// engines, at every whole second of `samples` (an engine without a sample at a
/// second, one that had finished, counts 0): `(t_s, waiting, running, kv_held)`.
#[must_use]
pub(super) fn totals(samples: &[Sample]) -> Vec<Total> {
    let mut by_t: BTreeMap<u64, (u64, u64, u64)> = Default::default();
    for x in samples {
        let e = by_t.entry(x.t_ms / 1000).or_default();
        e.0 += x.waiting;
        e.1 += x.running;
        e.2 += x.kv_held;
    }
    by_t.into_iter()
        .map(|(t, (w, r, k))| (t, w, r, k))
        .collect()
}

/// Time averages of `totals` over its first `span` seconds (waiting, kv_held); a
/// second missing counts 0.
pub(super) fn means(totals: &[Total], span: u64) -> (f64, f64) {
    let (mut w, mut k) = (0u64, 0u64);
    for &(t, wt, _, kt) in totals {
        if t < span {
            w += wt;
            k += kt;
        }
    }
    let n = span.max(1) as f64;
    (w as f64 / n, k as f64 / n)
}

/// Seconds covered by a series (last sample + 1).
pub(super) fn span_of(totals: &[Total]) -> u64 {
    totals.last().map_or(0, |t| t.0 + 1)
}

/// The queue series side by side, one row every `every_s` seconds (0: about 12 rows
/// over the longer series), replay then the simulator's first run.
#[must_use]
pub fn series_table(sides: &[Side], every_s: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "queue over time, all engines summed (replay / simulate): waiting, running, KV blocks held"
    );
    let _ = writeln!(
        out,
        "{:<16} {:>6} {:>15} {:>15} {:>23}",
        "mode", "t (s)", "waiting", "running", "KV held"
    );
    for side in sides {
        out.push_str(&rows(
            side.mode.name(),
            &side.replay.timeseries,
            &side.simulate_timeseries,
            every_s,
        ));
    }
    out
}

/// One mode's rows of [`series_table`].
fn rows(mode: &str, replay: &[Sample], simulate: &[Sample], every_s: u64) -> String {
    let mut out = String::new();
    let r = totals(replay);
    let m = totals(simulate);
    let span = span_of(&r).max(span_of(&m));
    let every = if every_s > 0 {
        every_s
    } else {
        span.div_ceil(12).max(1)
    };
    let at = |series: &[Total], t: u64| {
        series
            .iter()
            .find(|x| x.0 == t)
            .map_or((0, 0, 0), |x| (x.1, x.2, x.3))
    };
    let mut t = 0;
    while t < span {
        let (rw, rr, rk) = at(&r, t);
        let (sw, sr, sk) = at(&m, t);
        let _ = writeln!(
            out,
            "{:<16} {:>6} {:>15} {:>15} {:>23}",
            mode,
            t,
            format!("{rw} / {sw}"),
            format!("{rr} / {sr}"),
            format!("{rk} / {sk}"),
        );
        t += every;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_ms: u64, engine: u32, waiting: u64, running: u64, kv_held: u64) -> Sample {
        Sample {
            t_ms,
            engine,
            waiting,
            running,
            kv_held,
            preemptions: 0,
            lookups_in_flight: 0,
        }
    }

    #[test]
    fn series_are_summed_per_second_and_averaged_over_the_longer_span() {
        // Engine 1 finished after its second sample: it counts 0 at 2 s.
        let replay = [
            sample(0, 0, 1, 2, 100),
            sample(0, 1, 3, 1, 50),
            sample(1000, 0, 0, 4, 300),
            sample(1000, 1, 2, 2, 60),
            sample(2000, 0, 5, 1, 30),
        ];
        let sim = [
            sample(0, 0, 2, 2, 90),
            sample(1000, 0, 1, 3, 200),
            sample(2000, 0, 0, 0, 0),
            sample(3000, 0, 4, 4, 40),
        ];
        let r = totals(&replay);
        assert_eq!(r, [(0, 4, 3, 150), (1, 2, 6, 360), (2, 5, 1, 30)]);
        assert_eq!(span_of(&r), 3);
        let m = totals(&sim);
        // Over the simulator's 4 s, replay's missing fourth second counts 0.
        assert_eq!(means(&r, 4), (11.0 / 4.0, 540.0 / 4.0));
        assert_eq!(means(&m, 4), (7.0 / 4.0, 330.0 / 4.0));
        assert_eq!(
            rows("sync", &replay, &sim, 2),
            "sync                  0           4 / 2           3 / 2                150 / 90\n\
             sync                  2           5 / 0           1 / 0                  30 / 0\n"
        );
        // Every second by default on a span this short.
        assert_eq!(rows("sync", &replay, &sim, 0).lines().count(), 4);
        assert_eq!(rows("sync", &[], &[], 0), "");
    }
}
