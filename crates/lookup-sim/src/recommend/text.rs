//! The recommendation in words: the winner, its margins with their uncertainty, and
//! why each other mode lost.

use std::fmt::Write as _;

use super::Recommendation;

/// The recommendation as printed.
#[must_use]
pub fn describe(r: &Recommendation, repeats: u32) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "recommendation: the lowest TTFT p99 that holds over {repeats} perturbed reruns ({} settings tried, {} more runs)",
        r.tried.len(),
        r.runs
    );
    let Some(best) = &r.best else {
        out.push_str("  none: every setting tried was unstable (see the stability lines above)\n");
        return out;
    };
    let v = &best.verdict;
    let _ = writeln!(out, "  {}", best.setting.describe());
    let _ = write!(
        out,
        "  TTFT p99 {:.1} ms ({:.1}-{:.1} over reruns), p50 {:.1} ms",
        best.stable_p99_ms(),
        v.p99_ms.min,
        v.p99_ms.max,
        v.p50_ms.max
    );
    match &r.sync {
        Some(sync) if sync.setting == best.setting => out.push_str("; sync itself is best\n"),
        Some(sync) => {
            let (b, s) = (best.stable_p99_ms(), sync.stable_p99_ms());
            let _ = writeln!(
                out,
                "; margin over sync ({}): p99 {:.1} ms lower ({:.1} %; sync {:.1} ms)",
                sync.setting.describe(),
                s - b,
                (s - b) / s * 100.0,
                s
            );
        }
        None => out.push_str("; no stable sync setting to compare with\n"),
    }
    let mut noise = Vec::new();
    for m in &r.margins {
        let _ = write!(
            out,
            "  margin over the {} ({}): paired p99 ratio, theirs over the winner's, median ",
            m.against,
            m.setting.describe()
        );
        match &m.ratio {
            Some(p) => {
                let _ = writeln!(
                    out,
                    "{}{}",
                    p.describe(),
                    if p.within_noise {
                        ": INSIDE THE NOISE (the interval holds 1)"
                    } else {
                        ": outside the noise"
                    }
                );
                if p.within_noise {
                    noise.push(m.against);
                }
            }
            None => out.push_str("not paired (other reruns)\n"),
        }
    }
    if !noise.is_empty() {
        let _ = writeln!(
            out,
            "  the reruns do not tell the winner apart from the {}: either serves this trace as well",
            noise.join(" nor from ")
        );
    }
    if !r.losses.is_empty() {
        out.push_str("  why the other modes lost (each at its best setting tried):\n");
        for l in &r.losses {
            let _ = writeln!(
                out,
                "    {}: {}\n      (at {}{})",
                l.setting.mode,
                l.text,
                l.setting.describe(),
                if best.setting == l.against {
                    String::new()
                } else {
                    format!("; against {}", l.against.describe())
                }
            );
        }
    }
    out
}
