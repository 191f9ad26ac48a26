//! The judgement of a chaos run: every answer judged against the truth, counted per
//! fault and client, as a table and as JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use super::load::{Answer, Client};
use super::truth::{Bounds, Verdict};
use super::{Fault, Run};

/// The counts of one fault and one client.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    /// The phase's fault.
    pub fault: Fault,
    /// The client.
    pub client: Client,
    /// Answers given during the phase.
    pub answers: u64,
    /// Answers claiming at least one block.
    pub hits: u64,
    /// Answers that rested on an unavailable store (0 blocks, not a miss).
    pub unavailable: u64,
    /// Answers claiming a block the store did not hold, past the bound.
    pub wrong: u64,
    /// Probes longer than their limit.
    pub over_timeout: u64,
    /// The first wrong answer, seconds after the phase's start.
    pub first_wrong_s: Option<f64>,
    /// The last wrong answer, seconds after the phase's start.
    pub last_wrong_s: Option<f64>,
    /// The longest probe, milliseconds.
    pub longest_probe_ms: f64,
}

/// Whether `answer` claims a block the store did not hold past its bound.
#[must_use]
pub fn is_wrong(run: &Run, answer: &Answer, bounds: &Bounds) -> bool {
    let keys = &run.prompts.keys[answer.prompt];
    keys.iter().take(answer.blocks as usize).any(|key| {
        matches!(
            run.truth.judge(key, answer.at, bounds),
            Verdict::Wrong { .. }
        )
    })
}

/// One row per (fault, client) that answered, in phase order; a probe is over its
/// timeout when it took longer than `limit`.
#[must_use]
pub fn rows(run: &Run, answers: &[Answer], bounds: &Bounds, limit: Duration) -> Vec<Row> {
    let mut rows: BTreeMap<(usize, Client), Row> = BTreeMap::new();
    for answer in answers {
        let Some((index, phase)) = run
            .phases
            .iter()
            .enumerate()
            .find(|(_, p)| p.from <= answer.at && answer.at < p.until)
        else {
            continue;
        };
        let row = rows.entry((index, answer.client)).or_insert_with(|| Row {
            fault: phase.fault,
            client: answer.client,
            answers: 0,
            hits: 0,
            unavailable: 0,
            wrong: 0,
            over_timeout: 0,
            first_wrong_s: None,
            last_wrong_s: None,
            longest_probe_ms: 0.0,
        });
        row.answers += 1;
        row.hits += u64::from(answer.blocks > 0);
        row.unavailable += u64::from(answer.unavailable);
        let took = answer.at.saturating_sub(answer.started);
        row.over_timeout += u64::from(took > limit);
        row.longest_probe_ms = row.longest_probe_ms.max(took.as_secs_f64() * 1e3);
        if is_wrong(run, answer, bounds) {
            row.wrong += 1;
            let after = (answer.at - phase.from).as_secs_f64();
            row.first_wrong_s = Some(row.first_wrong_s.map_or(after, |f| f.min(after)));
            row.last_wrong_s = Some(row.last_wrong_s.map_or(after, |l| l.max(after)));
        }
    }
    rows.into_values().collect()
}

fn seconds(s: Option<f64>) -> String {
    s.map_or_else(|| "-".to_owned(), |s| format!("{s:.2}"))
}

/// The table, Markdown, with the bounds it judged by.
#[must_use]
pub fn table(rows: &[Row], bounds: &Bounds, limit: Duration) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Wrong: a claimed block gone longer than {:.1} s (removed: lease + TTL + slack) \
         or {:.1} s (lost with its master: TTL + slack). Over timeout: a probe longer \
         than {:.1} s.\n",
        bounds.removed.as_secs_f64(),
        bounds.lost.as_secs_f64(),
        limit.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "| fault | client | cache | answers | hits | unavailable | wrong | over timeout | first wrong s | last wrong s | longest probe ms |"
    );
    let _ = writeln!(out, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |",
            r.fault.name(),
            r.client.kind.name(),
            if r.client.cache { "on" } else { "off" },
            r.answers,
            r.hits,
            r.unavailable,
            r.wrong,
            r.over_timeout,
            seconds(r.first_wrong_s),
            seconds(r.last_wrong_s),
            r.longest_probe_ms
        );
    }
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    let over: u64 = rows.iter().map(|r| r.over_timeout).sum();
    let _ = writeln!(
        out,
        "\ntotal: {wrong} wrong, {over} over timeout (expected 0 and 0)"
    );
    out
}

/// The results as JSON: the bounds, the phases and the rows.
///
/// # Errors
/// Serialisation fails (it does not for these types).
pub fn json(rows: &[Row], run: &Run, bounds: &Bounds, limit: Duration) -> anyhow::Result<String> {
    let value = serde_json::json!({
        "lease_s": run.settings.lease.as_secs_f64(),
        "ttl_s": run.settings.ttl.as_secs_f64(),
        "bound_removed_s": bounds.removed.as_secs_f64(),
        "bound_lost_s": bounds.lost.as_secs_f64(),
        "probe_limit_s": limit.as_secs_f64(),
        "phases": run.phases.iter().map(|p| serde_json::json!({
            "fault": p.fault,
            "from_s": p.from.as_secs_f64(),
            "until_s": p.until.as_secs_f64(),
        })).collect::<Vec<_>>(),
        "rows": rows,
        "wrong": rows.iter().map(|r| r.wrong).sum::<u64>(),
        "over_timeout": rows.iter().map(|r| r.over_timeout).sum::<u64>(),
    });
    Ok(serde_json::to_string_pretty(&value)?)
}
