//! The recommendation in words: one headline line (the setting to use, or that no
//! lookup setting is told apart from the cheapest), how it was chosen, its margins on
//! the fresh reruns, what the capacity levers would buy, and why each other mode
//! lost.

use std::fmt::Write as _;

use super::capacity::Lever;
use super::outcome::{Decision, Recommendation};
use crate::margin::Paired;

fn interval(p: &Paired) -> String {
    format!(
        "{:.3}x (95 % interval {:.3}-{:.3}x)",
        p.median, p.interval.0, p.interval.1
    )
}

fn lever_line(out: &mut String, c: &Lever) {
    let _ = write!(
        out,
        "    {}: TTFT p99 {:.1}-{:.1} ms",
        c.lever, c.verdict.p99_ms.min, c.verdict.p99_ms.max
    );
    match &c.ratio {
        Some(p) => {
            let _ = write!(out, ", {} of the recommendation's", interval(p));
            if p.within_noise {
                out.push_str(" (inside the noise)");
            }
        }
        None => out.push_str(", not paired"),
    }
    if !c.verdict.stable {
        out.push_str("; UNSTABLE or unhealthy");
    }
    out.push('\n');
}

/// The recommendation as printed: its first line is the headline.
#[must_use]
pub fn describe(r: &Recommendation) -> String {
    let mut out = String::new();
    let n = r.repeats;
    let fresh = format!("{n} fresh reruns ({n}-{})", 2 * n - 1);
    let best = r.best.as_ref();
    let margin_of = |against: &str| {
        r.margins
            .iter()
            .find(|m| m.against == against)
            .and_then(|m| m.ratio.as_ref())
    };
    match (r.decision, best, r.recommended) {
        (Decision::Better, Some(b), Some(rec)) => {
            let _ = write!(out, "recommendation: {}", rec.describe());
            if let Some(p) = margin_of("cheapest") {
                let _ = write!(
                    out,
                    ": the cheapest setting's TTFT p99 is {} of it on {fresh}: outside the noise",
                    interval(p)
                );
            }
            if r.inside_noise.is_empty() {
                out.push('\n');
            } else {
                let _ = write!(
                    out,
                    "; {} inside the noise: the cheapest of the settings inside the noise of the best tried ({}",
                    r.inside_noise.join(", "),
                    b.setting.describe()
                );
                match margin_of("best tried") {
                    Some(p) => {
                        let _ = writeln!(out, ", its p99 {} of the recommendation's)", interval(p));
                    }
                    None => out.push_str(")\n"),
                }
            }
        }
        (Decision::Indistinguishable, Some(b), Some(rec)) => {
            let _ = write!(
                out,
                "recommendation: no lookup setting moves TTFT p99 by more than the noise: use the cheapest, {}",
                rec.describe()
            );
            match margin_of("best tried") {
                Some(p) => {
                    let _ = writeln!(
                        out,
                        " (the best tried, {}: p99 {} the cheapest's on {fresh})",
                        b.setting.describe(),
                        interval(p)
                    );
                }
                None => out.push('\n'),
            }
        }
        (Decision::CheapestIsBest, _, Some(rec)) => {
            let _ = writeln!(
                out,
                "recommendation: {}: the cheapest setting is also the best tried",
                rec.describe()
            );
        }
        (Decision::NotConfirmed, Some(b), Some(rec)) => {
            let _ = writeln!(
                out,
                "recommendation: the best tried ({}) is unstable or unhealthy on {fresh}; use the cheapest, {}",
                b.setting.describe(),
                rec.describe()
            );
        }
        _ => {
            out.push_str(
                "recommendation: none: every setting tried was unstable or unhealthy (see the stability lines above)\n",
            );
        }
    }
    let _ = writeln!(
        out,
        "  chosen on reruns 0-{} among {} settings by the largest p99 of its reruns; margins measured on {fresh}, which took no part in the choice ({} runs)",
        n - 1,
        r.tried.len(),
        r.runs
    );
    if let Some(v) = r.recommended.as_ref().and_then(|s| r.fresh(s)) {
        let _ = writeln!(
            out,
            "  TTFT p99 {:.1}-{:.1} ms, p50 {:.1}-{:.1} ms over the fresh reruns{}",
            v.p99_ms.min,
            v.p99_ms.max,
            v.p50_ms.min,
            v.p50_ms.max,
            if v.stable {
                ""
            } else {
                " (UNSTABLE or unhealthy there too)"
            }
        );
    }
    for m in &r.margins {
        let _ = write!(
            out,
            "  against the {} ({}): their p99 over the recommendation's ",
            m.against,
            m.setting.describe()
        );
        match &m.ratio {
            Some(p) => {
                let _ = writeln!(
                    out,
                    "{}, the recommendation lower in {} of {}{}",
                    interval(p),
                    p.wins,
                    p.runs,
                    if p.within_noise {
                        ": inside the noise"
                    } else {
                        ": outside the noise"
                    }
                );
            }
            None => out.push_str("not paired\n"),
        }
    }
    if !r.capacity.is_empty() {
        out.push_str(
            "  capacity, not lookup settings (what more hardware or another engine setting would buy at the recommended setting, fresh reruns):\n",
        );
        for c in &r.capacity {
            lever_line(&mut out, c);
        }
    }
    if let Some(k) = &r.keep_wait {
        out.push_str(
            "  not followed by vLLM's connector (at the recommended setting, fresh reruns):\n",
        );
        lever_line(&mut out, k);
    }
    if !r.losses.is_empty() {
        out.push_str("  why the other modes lost (each at its best setting, selection reruns):\n");
        for l in &r.losses {
            let _ = writeln!(
                out,
                "    {}: {}\n      (at {})",
                l.setting.mode,
                l.text,
                l.setting.describe()
            );
        }
    }
    out
}
