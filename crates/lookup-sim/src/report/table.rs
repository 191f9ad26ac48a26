//! The side-by-side table printed on the terminal: one row per figure, one column per
//! mode.

use std::fmt::Write as _;

use super::summary::ModeSummary;

type Row = (&'static str, fn(&ModeSummary) -> String);

fn pct(f: f64) -> String {
    format!("{:.1}%", f * 100.0)
}

const ROWS: [Row; 33] = [
    ("requests", |s| s.requests.to_string()),
    ("TTFT p50 (ms)", |s| format!("{:.1}", s.ttft_ms.p50)),
    ("TTFT p90 (ms)", |s| format!("{:.1}", s.ttft_ms.p90)),
    ("TTFT p99 (ms)", |s| format!("{:.1}", s.ttft_ms.p99)),
    ("TTFT mean (ms)", |s| format!("{:.1}", s.ttft_ms.mean)),
    ("TPOT p50 / p99 (ms)", |s| {
        format!("{:.1} / {:.1}", s.tpot_ms.p50, s.tpot_ms.p99)
    }),
    ("  queue / lookup wait (ms)", |s| {
        let b = &s.ttft_breakdown_ms;
        format!("{:.1} / {:.2}", b.queue, b.lookup_wait)
    }),
    ("  load / prefill (ms)", |s| {
        let b = &s.ttft_breakdown_ms;
        format!("{:.1} / {:.1}", b.load, b.prefill)
    }),
    ("queue wait mean (ms)", |s| {
        format!("{:.1}", s.queue_wait_mean_ms)
    }),
    ("lookup p50 / p99 (ms)", |s| {
        let l = &s.lookups.total_ms;
        format!("{:.2} / {:.2}", l.p50, l.p99)
    }),
    ("  on the wire p50 / p99 (ms)", |s| {
        let l = &s.lookups.on_wire_ms;
        format!("{:.2} / {:.2}", l.p50, l.p99)
    }),
    ("  server queue p50 / p99 (ms)", |s| {
        let l = &s.lookups.server_queue_ms;
        format!("{:.2} / {:.2}", l.p50, l.p99)
    }),
    ("lookups failed (timed out)", |s| {
        s.lookups.failed.to_string()
    }),
    ("keys asked per lookup (mean, p99)", |s| {
        let l = &s.lookups;
        format!("{:.0}, {:.0}", l.keys_asked_mean, l.keys_asked_p99)
    }),
    ("  store calls per lookup", |s| {
        format!("{:.2}", s.lookups.calls_mean)
    }),
    ("engine blocked on lookups (s)", |s| {
        format!("{:.3}", s.engine_blocked_s)
    }),
    ("ready at first probe", |s| {
        s.ready_at_first_probe.map_or_else(|| "-".into(), pct)
    }),
    ("  not ready: lookup on the wire", |s| {
        let p = &s.first_probes_pending;
        format!("{} ({} idle)", p.on_the_wire, p.on_the_wire_idle)
    }),
    ("  not ready: result expired (TTL)", |s| {
        s.first_probes_pending.expired.to_string()
    }),
    ("  not ready: not prefetched", |s| {
        s.first_probes_pending.not_prefetched.to_string()
    }),
    ("lookups deferred", |s| s.lookups_deferred.to_string()),
    ("waits: caught / budget mean (ms)", |s| {
        if s.waits.started == 0 {
            "-".into()
        } else {
            format!(
                "{} / {:.2}",
                pct(s.waits.caught_share),
                s.waits.budget_mean_ms
            )
        }
    }),
    ("RPCs sent", |s| s.rpcs_sent.to_string()),
    ("RPCs shared / promoted", |s| {
        format!("{} / {}", s.rpcs_shared, s.promotions)
    }),
    ("RPCs wasted", |s| s.rpcs_wasted.to_string()),
    ("external hit tokens", |s| s.external_hit_tokens.to_string()),
    ("local hit tokens", |s| s.local_hit_tokens.to_string()),
    ("TTL refreshes", |s| s.ttl_refreshes.to_string()),
    ("preemptions", |s| s.preemptions.to_string()),
    ("KV occupancy mean / peak", |s| {
        format!(
            "{} / {}",
            pct(s.kv_occupancy_mean),
            pct(s.kv_occupancy_peak)
        )
    }),
    ("waiting queue peak", |s| s.waiting_peak.to_string()),
    ("GPU utilisation", |s| pct(s.gpu_utilisation)),
    ("makespan (s)", |s| format!("{:.1}", s.makespan_s)),
];

/// The side-by-side table: one row per figure, one column per summary, headed by the
/// mode's name.
#[must_use]
pub fn table(summaries: &[ModeSummary]) -> String {
    let labels: Vec<String> = summaries.iter().map(|s| s.mode.name().to_owned()).collect();
    labelled(summaries, &labels)
}

/// [`table`] with column headings of the caller's, one per summary.
#[must_use]
pub fn labelled(summaries: &[ModeSummary], labels: &[String]) -> String {
    let label_w = ROWS.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let cells: Vec<Vec<String>> = ROWS
        .iter()
        .map(|(_, f)| summaries.iter().map(f).collect())
        .collect();
    let col_w: Vec<usize> = (0..summaries.len())
        .map(|c| {
            cells
                .iter()
                .map(|row| row[c].len())
                .chain(std::iter::once(labels[c].chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let _ = write!(out, "{:label_w$}", "");
    for (l, w) in labels.iter().zip(&col_w) {
        let _ = write!(out, "  {l:>w$}");
    }
    out.push('\n');
    for ((label, _), row) in ROWS.iter().zip(&cells) {
        let _ = write!(out, "{label:label_w$}");
        for (cell, w) in row.iter().zip(&col_w) {
            let _ = write!(out, "  {cell:>w$}");
        }
        out.push('\n');
    }
    out
}
